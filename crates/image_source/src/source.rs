//! The one entry point a request's image URL goes through: a `data:` URL is read in place,
//! anything else is fetched (or refused) under the pool's policy.

use crate::data_url::{DataUrl, DataUrlError, DataUrlLimits};
use crate::enough::{Enough, Prefix};
use crate::fetch::{FetchError, ImageFetcher};

/// Why an image URL was not read: the inline or the remote reason. A client error (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageSourceError {
    /// An inline `data:` image was refused.
    #[error(transparent)]
    Data(#[from] DataUrlError),
    /// A remote image was refused or could not be fetched.
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

impl ImageSourceError {
    /// A stable, low-cardinality label for metrics: the reason (pair it with
    /// [`origin`](Self::origin), as both sides have e.g. `refused`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Data(e) => e.code(),
            Self::Fetch(e) => e.code(),
        }
    }

    /// Where the image was to come from: `inline` or `remote`.
    pub fn origin(&self) -> &'static str {
        match self {
            Self::Data(_) => "inline",
            Self::Fetch(_) => "remote",
        }
    }

    /// The HTTP status for the client: always 400, the URL is the client's.
    pub fn status(&self) -> u16 {
        400
    }
}

/// Read the start of the image at `url`, as far as `enough` needs: a `data:` URL in place
/// under `limits`, any other URL through `fetcher` (which refuses it when its policy does
/// not fetch).
pub async fn read_image(
    url: &str,
    limits: &DataUrlLimits,
    fetcher: &ImageFetcher,
    enough: impl FnMut(&[u8]) -> Enough + Send,
) -> Result<Prefix, ImageSourceError> {
    if DataUrl::is_data_url(url) {
        return Ok(DataUrl::parse(url, limits)?.read(enough)?);
    }
    Ok(fetcher.fetch(url, enough).await?)
}
