"""vkad's errors as Python exceptions: one class per vkad::ErrorCode, all subclasses of Error.
The extension raises them with vkad's own message (registered by vkad/__init__.py)."""


class Error(RuntimeError):
    """An error reported by vkad; `code` is vkad's name for its kind."""
    code = "error"


class InvalidArgumentError(Error, ValueError):
    """The caller passed something wrong (bad IR, wrong argument types or shapes, ...)."""
    code = "invalid argument"


class NotFoundError(Error, LookupError):
    """A freed, released or unknown ndarray or kernel."""
    code = "not found"


class FailedPreconditionError(Error):
    """Not valid in the current state (a closed session; lavapipe's loop limit)."""
    code = "failed precondition"


class OutOfDeviceMemoryError(Error, MemoryError):
    code = "out of device memory"


class OutOfHostMemoryError(Error, MemoryError):
    code = "out of host memory"


class DeviceLostError(Error):
    """The device was lost; every later call on the session raises it."""
    code = "device lost"


class UnsupportedError(Error):
    """The device lacks a feature the kernel needs (e.g. f64)."""
    code = "unsupported"


class NoDeviceError(Error):
    """No Vulkan device qualifies."""
    code = "no Vulkan device"


class TimeoutError(Error):  # noqa: A001 - vkad's name; builtins.TimeoutError stays reachable
    code = "timeout"


class DeviceError(Error):
    """An error flag a kernel raised on the device (adstack overflow, out-of-bounds access, a
    NaN or infinity the finite checks found). A statement of a @vkad.kernel the message quotes
    gets its Python file and line appended, and so does an overflowed adstack's loop: the IR
    carries their source locations (`@"f.py:12:9"`)."""
    code = "device-side error"

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str) and '@"' in args[0]:
            try:
                from .frontend import with_python_lines
                args = (with_python_lines(args[0]),)
            except Exception:  # noqa: BLE001 - the message as vkad gave it is still right
                pass
        super().__init__(*args)


class VulkanError(Error):
    code = "Vulkan error"


class InternalError(Error):
    """A bug in vkad."""
    code = "internal error"


ERRORS = [InvalidArgumentError, NotFoundError, FailedPreconditionError, OutOfDeviceMemoryError,
          OutOfHostMemoryError, DeviceLostError, UnsupportedError, NoDeviceError, TimeoutError,
          DeviceError, VulkanError, InternalError]
