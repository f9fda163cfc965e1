"""User-facing errors: one line that names the file, node, op or option at fault."""


class GraphoptError(Exception):
    """An error graphopt reports to the user as one line, with a non-zero exit."""


class InputError(GraphoptError):
    """The input model or file is unusable."""


class OptionError(GraphoptError):
    """A command-line or API option is invalid."""


class ArtifactError(GraphoptError):
    """An .om artifact is malformed, tampered with or from an incompatible version."""


class VerificationError(GraphoptError):
    """The optimized model does not reproduce the original's outputs."""


class PassError(GraphoptError):
    """A pass failed or left the graph structurally invalid."""
