//! What every Knitter daemon and client does the same way around its requests and its
//! life: the bearer token on a request (put on by clients, read by servers), and stopping on
//! SIGTERM or SIGINT.

/// A token that cannot travel as an `authorization` header value (a newline or another
/// control character in the token file).
#[derive(Debug, thiserror::Error)]
#[error("the token is not valid in a request header (a control character in the token file?)")]
pub struct BadToken;

/// Puts `Authorization: Bearer <token>` on `req`.
pub fn bearer<T>(req: &mut tonic::Request<T>, token: &str) -> Result<(), BadToken> {
    let value = format!("Bearer {token}").parse().map_err(|_| BadToken)?;
    req.metadata_mut().insert("authorization", value);
    Ok(())
}

/// The token of an `Authorization` header's value: `Bearer <token>`, the scheme in any case
/// (RFC 7235 §2.1); `None` for another scheme or none.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start()).filter(|t| !t.is_empty())
}

/// Resolves on SIGTERM or SIGINT (saying which); never, saying so, where the handlers
/// cannot be installed.
pub async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = int.recv() => tracing::info!("SIGINT: stopping"),
    }
}

#[cfg(test)]
mod test {
    #[test]
    fn a_token_goes_on_the_request_or_is_refused() {
        let mut r = tonic::Request::new(());
        super::bearer(&mut r, "abc").unwrap();
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer abc");
        let back = r.metadata().get("authorization").and_then(|v| v.to_str().ok());
        assert_eq!(back.and_then(super::bearer_token), Some("abc"), "what a server reads");
        assert_eq!(super::bearer_token("bearer  abc"), Some("abc"), "the scheme in any case");
        for other in ["Basic abc", "Bearer", "Bearer ", "abc"] {
            assert_eq!(super::bearer_token(other), None, "{other:?}");
        }
        assert!(super::bearer(&mut r, "a\nb").is_err());
    }
}
