//! The caller's say in how much of an image is read: a closure over the bytes read so far
//! answers [`Enough`], and a read ends with a [`Prefix`].

/// What the caller needs after seeing the bytes read so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enough {
    /// The prefix is enough (e.g. the header with the dimensions was parsed): stop reading.
    Yes,
    /// Call again once at least `at_least` bytes in all are there.
    NeedMore {
        /// The total prefix length (not the increment) worth calling back at.
        at_least: usize,
    },
    /// The image is refused (e.g. a decoding bomb, not an image): stop with this reason,
    /// which reaches the client as it is.
    Stop(String),
}

/// The bytes read: a prefix the caller said was enough, or the whole image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    /// The bytes read, from the start of the image.
    pub bytes: Vec<u8>,
    /// True when the source ended before the caller said [`Enough::Yes`]: `bytes` is the
    /// whole image (and it is the caller's to decide whether that is enough, e.g. a
    /// truncated header).
    pub complete: bool,
}
