//! What kvgate did with images, by model: `kvgate_images_total{model, origin}` (images read
//! and counted, inline or remote) and `kvgate_image_refusals_total{model, reason}` (requests
//! refused for an image). A `forbidden_address` is an image URL that named a private,
//! loopback or metadata address: an SSRF attempt, or a misconfigured allow-list. Labels come
//! from the config and fixed sets, never from the client.

use crate::config::Config;

/// `kvgate_images_total`
pub const IMAGES_TOTAL: &str = "kvgate_images_total";
/// `kvgate_image_refusals_total`
pub const IMAGE_REFUSALS_TOTAL: &str = "kvgate_image_refusals_total";

/// Where an image came from.
pub const ORIGINS: [&str; 2] = ["inline", "remote"];

/// Why a request was refused for an image (`ImageRefusal::reason`, and `processor` for the
/// model's processor refusing the image, e.g. an aspect ratio over 200).
pub const REASONS: [&str; 9] = [
    "forbidden_address",
    "fetch_failed",
    "remote_off",
    "bad_url",
    "bad_data",
    "not_an_image",
    "too_large",
    "too_many",
    "processor",
];

/// An image of `model` was read and counted.
pub fn counted(model: &str, remote: bool) {
    let origin = if remote { "remote" } else { "inline" };
    ::metrics::counter!(IMAGES_TOTAL, "model" => model.to_owned(), "origin" => origin).increment(1);
}

/// A request for `model` was refused for an image, for `reason` (one of [`REASONS`]).
pub fn refused(model: &str, reason: &'static str) {
    ::metrics::counter!(IMAGE_REFUSALS_TOTAL, "model" => model.to_owned(), "reason" => reason)
        .increment(1);
}

/// Every vision model's series, at zero.
pub fn register(config: &Config) {
    for model in config.models.iter().filter(|m| m.vision.is_some()) {
        for origin in ORIGINS {
            ::metrics::counter!(IMAGES_TOTAL, "model" => model.name.clone(), "origin" => origin)
                .increment(0);
        }
        for reason in REASONS {
            ::metrics::counter!(IMAGE_REFUSALS_TOTAL, "model" => model.name.clone(), "reason" => reason)
                .increment(0);
        }
    }
}
