//! The CLI as a client of a running server's HTTP API. While `millrace serve` runs it holds the
//! pools' drives (each member is locked), so every command that touches a pool goes through the
//! API; with no server, the commands open the pools themselves.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A server the CLI talks to.
pub struct Api {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// How long one API call may take. Pool creation initialises parity in the request, so this is
/// generous; long work (rebuild, scrub) runs as a job and is polled.
const CALL_TIMEOUT: Duration = Duration::from_secs(3600);

impl Api {
    /// The server to use: `--api URL` (or MILLRACE_API) when given, else the one whose
    /// server file is in MILLRACE_HOME and whose process is alive.
    pub fn find(home: &Path, url: Option<&str>) -> Result<Option<Api>> {
        let token = std::env::var("MILLRACE_TOKEN")
            .ok()
            .filter(|t| !t.is_empty());
        if let Some(u) = url {
            let ca = std::env::var_os("MILLRACE_TLS_CA").map(std::path::PathBuf::from);
            return Ok(Some(Api::new(
                u.trim_end_matches('/').to_string(),
                token,
                ca.as_deref(),
            )?));
        }
        // The server's lock, not its pid (which a dead server leaves to whoever gets it next),
        // says whether it runs.
        if !millrace_service::server_running(home) {
            return Ok(None);
        }
        let sf = wait_until_ready(home)?;
        Ok(Some(Api::new(sf.url, token, sf.tls_cert.as_deref())?))
    }

    /// `ca`: a PEM certificate to trust for an HTTPS server (its own, when self-signed).
    fn new(base: String, token: Option<String>, ca: Option<&Path>) -> Result<Api> {
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(CALL_TIMEOUT));
        if let Some(ca) = ca {
            let pem = std::fs::read(ca)
                .with_context(|| format!("cannot read the API's certificate {}", ca.display()))?;
            let certs = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect::<Vec<_>>();
            if certs.is_empty() {
                bail!(
                    "{} holds no PEM certificate; point MILLRACE_TLS_CA at the API's certificate",
                    ca.display()
                );
            }
            config = config.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(certs)))
                    .build(),
            );
        }
        let agent: ureq::Agent = config.build().into();
        Ok(Api { base, token, agent })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn auth<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => r.header("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    fn finish(
        &self,
        what: &str,
        r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value> {
        let mut resp = r.map_err(|e| {
            anyhow!(
                "cannot reach the millrace server at {} ({e}); is `millrace serve` running?",
                self.base
            )
        })?;
        let status = resp.status();
        let body: Value = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_json()
            .unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        match body.get("error").and_then(|e| e.as_str()) {
            Some(msg) => bail!("{msg}"),
            None => bail!("the server refused {what} (HTTP {status})"),
        }
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        let r = self.auth(self.agent.get(self.url(path))).call();
        self.finish(&format!("GET {path}"), r)
    }

    pub fn get_as<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        serde_json::from_value(self.get(path)?)
            .with_context(|| format!("the server's answer to GET {path} is not what this CLI expects; are the CLI and the server the same version?"))
    }

    fn typed<T: DeserializeOwned>(what: &str, v: Value) -> Result<T> {
        serde_json::from_value(v)
            .with_context(|| format!("the server's answer to {what} is not what this CLI expects; are the CLI and the server the same version?"))
    }

    pub fn post_as<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let r = self.auth(self.agent.post(self.url(path))).send_json(body);
        Self::typed(
            &format!("POST {path}"),
            self.finish(&format!("POST {path}"), r)?,
        )
    }

    pub fn put_as<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let r = self.auth(self.agent.put(self.url(path))).send_json(body);
        Self::typed(
            &format!("PUT {path}"),
            self.finish(&format!("PUT {path}"), r)?,
        )
    }

    pub fn patch_as<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let r = self.auth(self.agent.patch(self.url(path))).send_json(body);
        Self::typed(
            &format!("PATCH {path}"),
            self.finish(&format!("PATCH {path}"), r)?,
        )
    }

    pub fn delete_as<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Self::typed(&format!("DELETE {path}"), self.delete(path)?)
    }

    pub fn delete(&self, path: &str) -> Result<Value> {
        let r = self.auth(self.agent.delete(self.url(path))).call();
        self.finish(&format!("DELETE {path}"), r)
    }

    /// Raw bytes of a pool.
    pub fn read_bytes(&self, pool: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let path = format!("/api/v1/pools/{pool}/data?offset={offset}&length={len}");
        let r = self.auth(self.agent.get(self.url(&path))).call();
        let mut resp =
            r.map_err(|e| anyhow!("cannot reach the millrace server at {} ({e})", self.base))?;
        if resp.status().is_success() {
            return Ok(resp.body_mut().with_config().limit(len + 1).read_to_vec()?);
        }
        let v: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
        match v.get("error").and_then(|e| e.as_str()) {
            Some(m) => bail!("{m}"),
            None => bail!(
                "the server refused to read pool {pool} (HTTP {})",
                resp.status()
            ),
        }
    }

    pub fn write_bytes<T: DeserializeOwned>(
        &self,
        pool: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<T> {
        let path = format!("/api/v1/pools/{pool}/data?offset={offset}");
        let r = self
            .auth(self.agent.put(self.url(&path)))
            .header("Content-Type", "application/octet-stream")
            .send(data);
        Self::typed(
            &format!("PUT {path}"),
            self.finish(&format!("PUT {path}"), r)?,
        )
    }
}

/// Percent-encodes a path segment (pool and volume names are plain, but the CLI never trusts that).
pub fn seg(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The server file of the server that holds `home`. A server writes it once every port
/// answers; one that holds the home without it is still starting (assembling its pools,
/// bringing shares back), so this waits for it (MILLRACE_START_WAIT seconds, 300 by default)
/// rather than treating the home as unserved.
fn wait_until_ready(home: &Path) -> Result<millrace_service::ServerFile> {
    let f = millrace_service::server_file(home);
    let limit = std::env::var("MILLRACE_START_WAIT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(300), Duration::from_secs);
    let t0 = std::time::Instant::now();
    let mut told = false;
    loop {
        let read = std::fs::read_to_string(&f).ok();
        if let Some(sf) = read.and_then(|t| serde_json::from_str(&t).ok()) {
            return Ok(sf);
        }
        if !millrace_service::server_running(home) {
            bail!(
                "the millrace server for {} stopped while it was starting; see its log",
                home.display()
            );
        }
        if t0.elapsed() >= limit {
            bail!(
                "millrace serve holds {} but has not finished starting after {} s; see its log (set MILLRACE_START_WAIT to wait longer)",
                home.display(),
                limit.as_secs()
            );
        }
        if !told {
            eprintln!(
                "millrace serve is starting (assembling pools); waiting for it to be ready..."
            );
            told = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
