"""Errors the user can act on. The entry points turn these into one line and a non-zero exit."""


class HvdNgpError(Exception):
    """Base class: a problem with the user's input or environment, not a bug in hvd_ngp."""


class ConfigError(HvdNgpError):
    """Invalid command line, config file or network config."""


class SceneError(HvdNgpError):
    """A scene (transforms file, images, poses) cannot be used. The message names the file."""


class SnapshotError(HvdNgpError):
    """A snapshot or checkpoint cannot be read or written."""


class BackendError(HvdNgpError):
    """A requested compute backend (GPU kernels, tinycudann, Horovod) is not available."""
