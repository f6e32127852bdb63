//! The body of the final hop, read only as far as the caller's closure needs and never past
//! the policy's byte cap. Returning drops the body, and with it the connection.

use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::FetchError;
use crate::enough::{Enough, Prefix};

/// Read `body` until `enough` says [`Enough::Yes`], the body ends, or more than `max_bytes`
/// would be needed.
pub(crate) async fn read(
    mut body: Incoming,
    host: &str,
    max_bytes: usize,
    enough: &mut (dyn FnMut(&[u8]) -> Enough + Send),
) -> Result<Prefix, FetchError> {
    let mut bytes: Vec<u8> = Vec::new();
    // The closure is called once at least `want` bytes are there, and has seen `seen`.
    let mut want = 1;
    let mut seen = 0;
    loop {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|e| FetchError::Protocol {
            host: host.into(),
            reason: e.to_string(),
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let room = max_bytes.saturating_sub(bytes.len());
        bytes.extend_from_slice(&data[..data.len().min(room)]);
        if bytes.len() < want {
            continue;
        }
        seen = bytes.len();
        match enough(&bytes) {
            Enough::Yes => {
                return Ok(Prefix {
                    bytes,
                    complete: false,
                })
            }
            Enough::Stop(reason) => return Err(FetchError::Refused(reason)),
            Enough::NeedMore { at_least } => want = at_least.max(bytes.len() + 1),
        }
        if want > max_bytes {
            return Err(FetchError::TooLarge { max_bytes });
        }
    }
    // The body ended: the caller sees the whole image once, and decides.
    if seen < bytes.len() || bytes.is_empty() {
        if let Enough::Stop(reason) = enough(&bytes) {
            return Err(FetchError::Refused(reason));
        }
    }
    Ok(Prefix {
        bytes,
        complete: true,
    })
}
