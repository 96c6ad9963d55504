"""The step types, for the step kinds: defined in onnxbuild.spec (the engine's layer below the kinds)."""

from onnxbuild.spec import Limits, Resources, StepContext, StepInput, StepResult, StepSpec

__all__ = ["Limits", "Resources", "StepContext", "StepInput", "StepResult", "StepSpec"]
