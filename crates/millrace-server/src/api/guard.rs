//! DNS rebinding and cross-site requests. With no token (the API on loopback), any page a
//! browser on this machine opens could call the API: through a name the attacker points at
//! 127.0.0.1 (rebinding: the browser then sends that name as `Host`), or straight at
//! 127.0.0.1 from its own origin (the browser sends `Origin`). So on loopback, `Host` must name
//! loopback (localhost, 127.x.x.x, [::1]), the address the API is bound to, or a name the admin
//! allowed (`serve --api-allow-host`); anywhere, an `Origin` must be the same host as `Host`, or
//! one of those. Other requests are refused before any handler runs.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ErrorBody;

/// Whom the API answers.
#[derive(Clone, Debug)]
pub struct HostGuard {
    /// The address the API is bound to.
    pub bound: SocketAddr,
    /// Names (or addresses) allowed besides loopback and `bound`, lower case.
    pub allowed: Vec<String>,
}

impl HostGuard {
    pub fn new(bound: SocketAddr, allowed: &[String]) -> HostGuard {
        HostGuard {
            bound,
            allowed: allowed.iter().map(|h| h.to_ascii_lowercase()).collect(),
        }
    }

    /// `Host` is checked where the API has no token to guard it (loopback), or where the admin
    /// gave a list.
    fn checks_host(&self) -> bool {
        self.bound.ip().is_loopback() || !self.allowed.is_empty()
    }

    fn allows(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        if host == "localhost" || self.allowed.contains(&host) {
            return true;
        }
        match host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            Ok(ip) => {
                ip.is_loopback() || (!self.bound.ip().is_unspecified() && ip == self.bound.ip())
            }
            Err(_) => false,
        }
    }
}

/// The host part of a `Host` header value (`name`, `name:port`, `[v6]:port`).
fn host_part(v: &str) -> &str {
    let v = v.trim();
    if let Some(rest) = v.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match v.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => v,
    }
}

/// The host part of an `Origin` (`scheme://host[:port]`); `None` for `null` and the like.
fn origin_host(v: &str) -> Option<&str> {
    let (_, rest) = v.trim().split_once("://")?;
    Some(host_part(rest.split('/').next().unwrap_or("")))
}

pub async fn check(
    State(guard): State<Arc<HostGuard>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(host_part)
        // HTTP/1.1 requires Host; an HTTP/2 request carries it in the URI instead.
        .or(req.uri().host());
    if guard.checks_host() && !host.is_some_and(|h| guard.allows(h)) {
        let msg = format!(
            "this API answers requests for {} only, not for the host '{}' (a page using a rebound name could otherwise drive it); call it by that address, or start the server with --api-allow-host NAME",
            guard.bound,
            host.unwrap_or("")
        );
        tracing::warn!("{msg}");
        return (StatusCode::MISDIRECTED_REQUEST, Json(ErrorBody::new(msg))).into_response();
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let o = origin.to_str().ok().and_then(origin_host);
        let same = o.is_some_and(|o| host.is_some_and(|h| h.eq_ignore_ascii_case(o)));
        if !same && !o.is_some_and(|o| guard.allows(o)) {
            let msg = format!(
                "a page from {} may not call this API (cross-origin); use the dashboard the server itself serves, or the CLI",
                origin.to_str().unwrap_or("an unreadable origin")
            );
            tracing::warn!("{msg}");
            return (StatusCode::FORBIDDEN, Json(ErrorBody::new(msg))).into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins_parse() {
        assert_eq!(host_part("127.0.0.1:8740"), "127.0.0.1");
        assert_eq!(host_part("[::1]:8740"), "::1");
        assert_eq!(host_part("localhost"), "localhost");
        assert_eq!(
            origin_host("http://evil.example:8740"),
            Some("evil.example")
        );
        assert_eq!(origin_host("null"), None);
        let g = HostGuard::new("127.0.0.1:8740".parse().unwrap(), &["Box.Lan".into()]);
        assert!(g.allows("127.0.0.5") && g.allows("::1") && g.allows("LOCALHOST"));
        assert!(g.allows("box.lan") && !g.allows("evil.example") && !g.allows("10.0.0.1"));
        let any = HostGuard::new("0.0.0.0:8740".parse().unwrap(), &[]);
        assert!(!any.checks_host() && !any.allows("0.0.0.0"));
    }
}
