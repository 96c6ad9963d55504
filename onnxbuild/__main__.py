from onnxbuild.entry import main

main()
