//! The request's priority class: the `x-kvgate-priority` header within the tenant's
//! `max_priority`, else the tenant's default `priority` (issue 30). A full pool's queue
//! (`fleet::FairQueue`) serves a higher class first and sheds the lowest first.
//!
//! Run by the tenant-rules stage (it is a tenant permission): a class above the tenant's
//! maximum is 403 `priority_not_allowed`, a value that names no class is 400.
//!
//! Reads: the tenant's `TenantPolicy`, the `x-kvgate-priority` header. Writes:
//! [`RequestPriority`].

use http::HeaderMap;

use crate::config::Priority;
use crate::error::GatewayError;
use crate::tenant::TenantPolicy;

/// The request header naming a priority class.
pub const PRIORITY_HEADER: &str = "x-kvgate-priority";

/// The request's priority class, allowed for its tenant (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestPriority(pub Priority);

/// The class of a request of `policy`'s tenant carrying `headers`.
pub fn resolve(headers: &HeaderMap, policy: &TenantPolicy) -> Result<Priority, GatewayError> {
    let Some(value) = headers.get(PRIORITY_HEADER) else {
        return Ok(policy.priority);
    };
    let asked: Priority = value
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            GatewayError::invalid(
                format!(
                    "The {PRIORITY_HEADER} header must be one of sheddable, standard, critical."
                ),
                None,
            )
        })?;
    if asked > policy.max_priority {
        return Err(GatewayError::PriorityNotAllowed {
            tenant: policy.name.to_string(),
            asked: asked.as_str(),
            max: policy.max_priority.as_str(),
        });
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, StatusCode};

    fn policy(priority: Priority, max_priority: Priority) -> TenantPolicy {
        TenantPolicy {
            priority,
            max_priority,
            ..TenantPolicy::anonymous()
        }
    }

    fn with(value: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(PRIORITY_HEADER, HeaderValue::from_bytes(value).unwrap());
        headers
    }

    #[test]
    fn absent_header_gets_the_tenant_default() {
        let p = policy(Priority::Sheddable, Priority::Critical);
        assert_eq!(resolve(&HeaderMap::new(), &p).unwrap(), Priority::Sheddable);
    }

    #[test]
    fn the_header_chooses_any_class_up_to_the_maximum() {
        let p = policy(Priority::Standard, Priority::Critical);
        for class in Priority::ALL {
            assert_eq!(
                resolve(&with(class.as_str().as_bytes()), &p).unwrap(),
                class
            );
        }
        let p = policy(Priority::Standard, Priority::Standard);
        assert_eq!(
            resolve(&with(b"sheddable"), &p).unwrap(),
            Priority::Sheddable
        );
    }

    #[test]
    fn above_the_maximum_is_403_naming_it() {
        let p = policy(Priority::Standard, Priority::Standard);
        let err = resolve(&with(b"critical"), &p).unwrap_err();
        assert_eq!(err.status(), StatusCode::FORBIDDEN);
        assert_eq!(err.code(), "priority_not_allowed");
        let message = err.client_message();
        assert!(message.contains("`standard`"), "{message}");
        assert!(message.contains("`anonymous`"), "{message}");
    }

    #[test]
    fn garbage_is_400_naming_the_classes() {
        let p = policy(Priority::Standard, Priority::Critical);
        for bad in [&b"urgent"[..], b"", b"CRITICAL", b"\xff"] {
            let err = resolve(&with(bad), &p).unwrap_err();
            assert_eq!(err.status(), StatusCode::BAD_REQUEST);
            assert!(err
                .client_message()
                .contains("sheddable, standard, critical"));
        }
    }
}
