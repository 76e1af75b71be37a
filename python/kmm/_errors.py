"""Kmm's status codes as Python exceptions. Every error carries `status` (the code), `name`
("KMM_ERROR_OUT_OF_MEMORY") and `message` (libkmm's text for the failed call)."""

from . import _lib


class NotCopyable:
    """A base for objects that own something freed once (a libkmm handle, a DLPack deleter, an
    export): a copy would free it twice, or free what the original still uses. `copy.copy`,
    `copy.deepcopy` and pickling raise `TypeError`."""

    __slots__ = ()

    def __reduce_ex__(self, protocol):
        raise TypeError("a %s owns what it frees (a handle of libkmm or an export) and cannot be copied or "
                        "pickled" % type(self).__name__)


class KmmError(Exception):
    """A libkmm call failed. Subclasses name the status; `status`, `name`, `message` say more."""

    status = None

    def __init__(self, message, status=None):
        if status is not None:
            self.status = status
        self.name = _lib.STATUS.get(self.status, "KMM_UNKNOWN_STATUS")
        self.message = message
        super().__init__("%s: %s" % (self.name, message))

    def __reduce__(self):
        # Pickled (from a worker process) as the call that made it: Exception's own reduce
        # passes args, "NAME: message", as the message (the name doubled) and drops `status`.
        # The rest of the state (memory_status, attributes set later) follows.
        return type(self), (self.message, self.status), self.__dict__


class NullPointerError(KmmError, ValueError):
    status = 1001


class InvalidArgumentError(KmmError, ValueError):
    status = 1002


class OutOfRangeError(KmmError, IndexError):
    status = 1003


class SizeOverflowError(KmmError, OverflowError):
    status = 1004


class InvalidHandleError(KmmError):
    status = 2001


class BufferMappedError(KmmError):
    status = 2002


class WrongKindError(KmmError, TypeError):
    status = 2003


class OutOfMemoryError(KmmError, MemoryError):
    """Out of memory after every rung. The message gives the request, the free space and the
    largest free block, the largest holders and what was tried; from `Manager.alloc` and
    arrays, `memory_status` holds the manager's status at the failure (shown in Jupyter)."""

    status = 3001
    memory_status = None

    def _repr_html_(self):
        if self.memory_status is None:
            return None
        import html

        return "<pre>%s</pre>%s" % (html.escape(str(self)), self.memory_status.svg)


class BackendUnavailableError(KmmError, RuntimeError):
    status = 4001


class BackendError(KmmError, RuntimeError):
    status = 4002


class NotSupportedError(KmmError, NotImplementedError):
    status = 4003


class CompileError(KmmError, RuntimeError):
    status = 4004


class InternalError(KmmError, RuntimeError):
    status = 9001


BY_STATUS = {
    cls.status: cls
    for cls in (
        NullPointerError, InvalidArgumentError, OutOfRangeError, SizeOverflowError,
        InvalidHandleError, BufferMappedError, WrongKindError, OutOfMemoryError,
        BackendUnavailableError, BackendError, NotSupportedError, CompileError, InternalError,
    )
}


def error(status):
    """The exception for a failed call's status, with this thread's last-error message."""
    message = _lib.lib.kmm_last_error().decode("utf-8", "replace")
    cls = BY_STATUS.get(status)
    if cls is None:
        return KmmError(message, status)
    return cls(message)


def check(status):
    """Raises the matching KmmError unless `status` is KMM_OK."""
    if status:
        raise error(status)
