"""Python exceptions for the library's errors (moe_ep::Error and its ErrorCode).

Every error the C++ library raises is a ``moe_ep.Error`` (a ``RuntimeError``) carrying the
library's message. Errors about the caller's arguments are also ``ValueError`` so that code
written against vLLM/torch conventions catches them:

=====================  ==============================  ==================================
ErrorCode              Python class                    also a
=====================  ==============================  ==================================
kInvalidArgument       InvalidArgumentError            ValueError
kCapacity              CapacityError                   ValueError
kUnsupported           UnsupportedError                NotImplementedError
kDestroyed             DestroyedError                  -
kPeer                  PeerError                       -
kBackend               BackendError                    -
kState                 StateError                      -
=====================  ==============================  ==================================
"""


class Error(RuntimeError):
    """Base class of every moe_ep error; the message is the library's."""

    code = "error"


class InvalidArgumentError(Error, ValueError):
    """Bad dtype, shape, stride, device, value range or configuration."""

    code = "invalid_argument"


class CapacityError(Error, ValueError):
    """More tokens than the workspace serves (the message names both numbers)."""

    code = "capacity"


class UnsupportedError(Error, NotImplementedError):
    """A configuration this build or device cannot run (the message lists every reason)."""

    code = "unsupported"


class DestroyedError(Error):
    """A call after destroy()."""

    code = "destroyed"


class PeerError(Error):
    """A peer rank failed or never arrived (the message names the rank and the stage)."""

    code = "peer"


class BackendError(Error):
    """CUDA, NCCL or system failure."""

    code = "backend"


class StateError(Error):
    """A call not valid in the layer's mode (e.g. forward() on a do_finalize=False layer)."""

    code = "state"


# Registered with the extension by code name (error_code_name in src/common/status.cpp).
BY_CODE = [
    InvalidArgumentError,
    CapacityError,
    UnsupportedError,
    DestroyedError,
    PeerError,
    BackendError,
    StateError,
]
