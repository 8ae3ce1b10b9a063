//! The target's API for in-band authentication: setting, rotating and removing a host's
//! DH-HMAC-CHAP secrets on a live subsystem, and what may be shown of them.

use super::*;
use crate::dhchap::{AuthInfo, HostKeys};

impl Target {
    /// Sets (Some) or removes (None) the secrets `host` authenticates with on subsystem `nqn`.
    /// Queues already authenticated stay so; the next authentication (a new queue, or the
    /// host's re-authentication) uses the new secrets. Set a host's secret before allowing
    /// the host, so that it never connects without one.
    pub fn set_host_keys(
        &self,
        nqn: &str,
        host: &str,
        keys: Option<HostKeys>,
    ) -> Result<(), Error> {
        check_nqn(host)?;
        let s = self.subsystem(nqn)?;
        let mut k = s.auth.keys.write();
        match keys {
            Some(keys) => k.insert(host.to_string(), keys),
            None => k.remove(host),
        };
        Ok(())
    }

    /// Sets (Some) or removes (None) the configured TLS PSK `host` proves itself with on
    /// subsystem `nqn`, on listeners that require TLS. Connections already open keep theirs;
    /// the next handshake uses the new key.
    pub fn set_host_tls_psk(
        &self,
        nqn: &str,
        host: &str,
        psk: Option<crate::tls::Psk>,
    ) -> Result<(), Error> {
        check_nqn(host)?;
        let s = self.subsystem(nqn)?;
        let mut k = s.tls_psks.write();
        match psk {
            Some(p) => k.insert(host.to_string(), p),
            None => k.remove(host),
        };
        Ok(())
    }

    /// The hosts of subsystem `nqn` that have a TLS PSK, sorted (never the keys).
    pub fn tls_hosts(&self, nqn: &str) -> Result<Vec<String>, Error> {
        let s = self.subsystem(nqn)?;
        let mut v: Vec<String> = s.tls_psks.read().keys().cloned().collect();
        v.sort();
        Ok(v)
    }

    /// Each subsystem's hosts that authenticate and its counts of authentications, sorted
    /// by NQN. Secrets are never part of it.
    pub fn auth_info(&self) -> Vec<AuthInfo> {
        let mut v: Vec<AuthInfo> = (self.inner.subsystems.read().values())
            .map(|s| {
                let mut hosts: Vec<(String, bool)> = (s.auth.keys.read().iter())
                    .map(|(h, k)| (h.clone(), k.ctrl.is_some()))
                    .collect();
                hosts.sort();
                AuthInfo {
                    nqn: s.nqn.clone(),
                    hosts,
                    succeeded: s.auth.succeeded.load(Ordering::Relaxed),
                    failed: s.auth.failed.load(Ordering::Relaxed),
                }
            })
            .collect();
        v.sort_by(|a, b| a.nqn.cmp(&b.nqn));
        v
    }
}
