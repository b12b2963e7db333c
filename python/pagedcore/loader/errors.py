"""The one error type the loader raises: what was found, what is supported, what to do."""


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says what was found and what pagedcore supports."""
