from onnxbuild.cli import main

main()
