//! The one status enum of the C ABI and the error type every layer returns.

use std::fmt;

/// Result of every exported function. `KMM_OK` is zero; errors are grouped in bands by category
/// (1xxx: the caller's arguments, 2xxx: handles and buffer state, 3xxx: resources, 4xxx: the
/// backend, 9xxx: bugs in Kmm). Codes are never renumbered; retired codes stay reserved.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmStatus {
    /// Success.
    KMM_OK = 0,
    /// A pointer argument that must not be NULL was NULL.
    KMM_ERROR_NULL_POINTER = 1001,
    /// An argument is outside the values it may take (an unknown enum value, a zero where none is
    /// allowed, a misaligned alignment).
    KMM_ERROR_INVALID_ARGUMENT = 1002,
    /// An offset or length reaches past the end of a buffer.
    KMM_ERROR_OUT_OF_RANGE = 1003,
    /// A size computation overflowed 64 bits or exceeds what the allocator can serve.
    KMM_ERROR_SIZE_OVERFLOW = 1004,
    /// The handle is not live: never issued, freed, stale, forged, of another manager, or of a
    /// destroyed manager.
    KMM_ERROR_INVALID_HANDLE = 2001,
    /// The buffer is mapped (pin count above zero) and the operation needs it unmapped.
    KMM_ERROR_BUFFER_MAPPED = 2002,
    /// The buffer is of the wrong memory kind for the operation.
    KMM_ERROR_WRONG_KIND = 2003,
    /// The allocation does not fit: the device, the pool or the manager's hard limit is exhausted.
    KMM_ERROR_OUT_OF_MEMORY = 3001,
    /// The requested backend cannot be used here (no CUDA driver or no such device).
    KMM_ERROR_BACKEND_UNAVAILABLE = 4001,
    /// The backend (the CUDA driver) reported an error; the message names the call and the code.
    KMM_ERROR_BACKEND = 4002,
    /// The operation is not supported by this backend or configuration.
    KMM_ERROR_NOT_SUPPORTED = 4003,
    /// Run-time compilation of a CUDA module failed; the message holds the compiler's log.
    KMM_ERROR_COMPILE = 4004,
    /// A bug in Kmm (a panic stopped at the ABI boundary). Please report it with the message.
    KMM_ERROR_INTERNAL = 9001,
}

#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    pub status: KmmStatus,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(status: KmmStatus, message: impl Into<String>) -> Self {
        Error { status, message: message.into() }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.status, self.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// `fail!(STATUS, "format", args…)` returns early with an [`Error`].
#[macro_export]
macro_rules! fail {
    ($status:ident, $($arg:tt)*) => {
        return Err($crate::error::Error::new($crate::error::KmmStatus::$status, format!($($arg)*)))
    };
}

/// `err!(STATUS, "format", args…)` builds an [`Error`].
#[macro_export]
macro_rules! err {
    ($status:ident, $($arg:tt)*) => {
        $crate::error::Error::new($crate::error::KmmStatus::$status, format!($($arg)*))
    };
}

impl KmmStatus {
    const ALL: [KmmStatus; 14] = [KmmStatus::KMM_OK, KmmStatus::KMM_ERROR_NULL_POINTER, KmmStatus::KMM_ERROR_INVALID_ARGUMENT, KmmStatus::KMM_ERROR_OUT_OF_RANGE, KmmStatus::KMM_ERROR_SIZE_OVERFLOW, KmmStatus::KMM_ERROR_INVALID_HANDLE, KmmStatus::KMM_ERROR_BUFFER_MAPPED, KmmStatus::KMM_ERROR_WRONG_KIND, KmmStatus::KMM_ERROR_OUT_OF_MEMORY, KmmStatus::KMM_ERROR_BACKEND_UNAVAILABLE, KmmStatus::KMM_ERROR_BACKEND, KmmStatus::KMM_ERROR_NOT_SUPPORTED, KmmStatus::KMM_ERROR_COMPILE, KmmStatus::KMM_ERROR_INTERNAL];

    pub fn from_u32(value: u32) -> Option<KmmStatus> {
        Self::ALL.iter().copied().find(|s| *s as u32 == value)
    }

    /// The status of a name ("KMM_ERROR_OUT_OF_MEMORY"), as `name` gives it.
    pub fn from_name(name: &str) -> Option<KmmStatus> {
        Self::ALL.iter().copied().find(|s| s.name().to_str() == Ok(name))
    }

    pub fn name(self) -> &'static std::ffi::CStr {
        use KmmStatus::*;
        match self {
            KMM_OK => c"KMM_OK",
            KMM_ERROR_NULL_POINTER => c"KMM_ERROR_NULL_POINTER",
            KMM_ERROR_INVALID_ARGUMENT => c"KMM_ERROR_INVALID_ARGUMENT",
            KMM_ERROR_OUT_OF_RANGE => c"KMM_ERROR_OUT_OF_RANGE",
            KMM_ERROR_SIZE_OVERFLOW => c"KMM_ERROR_SIZE_OVERFLOW",
            KMM_ERROR_INVALID_HANDLE => c"KMM_ERROR_INVALID_HANDLE",
            KMM_ERROR_BUFFER_MAPPED => c"KMM_ERROR_BUFFER_MAPPED",
            KMM_ERROR_WRONG_KIND => c"KMM_ERROR_WRONG_KIND",
            KMM_ERROR_OUT_OF_MEMORY => c"KMM_ERROR_OUT_OF_MEMORY",
            KMM_ERROR_BACKEND_UNAVAILABLE => c"KMM_ERROR_BACKEND_UNAVAILABLE",
            KMM_ERROR_BACKEND => c"KMM_ERROR_BACKEND",
            KMM_ERROR_NOT_SUPPORTED => c"KMM_ERROR_NOT_SUPPORTED",
            KMM_ERROR_COMPILE => c"KMM_ERROR_COMPILE",
            KMM_ERROR_INTERNAL => c"KMM_ERROR_INTERNAL",
        }
    }
}

/// Locks either kind of mutex the crate uses. std's lock survives poisoning: a panic is already
/// reported as `KMM_ERROR_INTERNAL` at the boundary, and refusing every later call (including
/// frees from finalizers) would only turn one bug into a leak.
pub fn lock<L: Lockable>(m: &L) -> L::Guard<'_> {
    m.acquire()
}

pub trait Lockable {
    type Guard<'a>
    where
        Self: 'a;
    fn acquire(&self) -> Self::Guard<'_>;
}

impl<T> Lockable for std::sync::Mutex<T> {
    type Guard<'a> = std::sync::MutexGuard<'a, T> where T: 'a;
    fn acquire(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The manager's hot lock: parking_lot spins briefly before sleeping, which keeps a manager
/// shared by many threads from collapsing into futex round trips.
impl<T> Lockable for parking_lot::Mutex<T> {
    type Guard<'a> = parking_lot::MutexGuard<'a, T> where T: 'a;
    fn acquire(&self) -> Self::Guard<'_> {
        self.lock()
    }
}

impl<M: Lockable> Lockable for std::sync::Arc<M> {
    type Guard<'a> = M::Guard<'a> where M: 'a;
    fn acquire(&self) -> Self::Guard<'_> {
        (**self).acquire()
    }
}
