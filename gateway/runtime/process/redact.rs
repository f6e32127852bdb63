//! Secrets out of logs: a Redis URL's password never reaches a log line or an error.

/// `redis://user:secret@host/0` → `redis://user:***@host/0`: for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, None), |(a, p)| (a, Some(p)));
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
    let mut out = format!("{scheme}://{user}:***@{host}");
    if let Some(path) = path {
        out.push('/');
        out.push_str(path);
    }
    out
}

/// `text` with the password of `url` (if any) replaced (a client error may quote the URL).
pub(crate) fn redact_in(text: &str, url: &str) -> String {
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|authority| authority.rsplit_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, p)| p)
        .filter(|p| !p.is_empty());
    match password {
        Some(p) => text.replace(p, "***"),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_passwords_never_reach_logs() {
        assert_eq!(
            redact_url("redis://default:s3cret@10.0.0.9:6379/0"),
            "redis://default:***@10.0.0.9:6379/0"
        );
        assert_eq!(redact_url("redis://:s3cret@h"), "redis://:***@h");
        assert_eq!(
            redact_url("unix:///run/redis.sock"),
            "unix:///run/redis.sock"
        );
        assert_eq!(
            redact_in("failed: redis://:s3cret@h refused", "redis://:s3cret@h"),
            "failed: redis://:***@h refused"
        );
    }
}
