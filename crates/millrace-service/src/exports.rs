//! Exports of volumes: their settings live in the volume's props (so they travel with the pool
//! and survive restarts); this module turns them into live NVMe/TCP subsystems and NBD exports.

use std::sync::Arc;

use millrace_block::BlockDevice;
use millrace_volume::VolumeInfo;

use crate::error::ApiError;
use crate::model::{
    AnaRequest, ExportsView, NbdExportView, NvmeConnection, NvmeExportView, NvmePath,
    NvmeRegistrant, NvmeReservation,
};
use crate::props::{
    check_nqn, default_nqn, NbdExportConfig, NvmeExportConfig, NBD_PROP, NVME_PROP, SHARE_PROP,
};
use crate::state::{PoolEntry, State};

/// Serialises changes to an export's host list (each reads the volume's props, changes them and
/// writes them back).
static HOST_CHANGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn uuid_bytes(v: &VolumeInfo) -> [u8; 16] {
    *v.uuid.as_bytes()
}

impl State {
    fn metered(
        &self,
        pool: &str,
        e: &PoolEntry,
        v: &VolumeInfo,
    ) -> Result<Arc<dyn BlockDevice>, ApiError> {
        let vol = e
            .volumes
            .open_volume(&v.name)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(self.meters.wrap(pool, &v.name, vol))
    }

    pub(crate) fn start_nvme(
        &self,
        pool: &str,
        e: &PoolEntry,
        v: &VolumeInfo,
        c: &NvmeExportConfig,
    ) -> Result<(), ApiError> {
        let dev = self.metered(pool, e, v)?;
        let serial: String = v.uuid.simple().to_string()[..20].to_uppercase();
        // With its hosts' secrets from the start: no window in which they connect without.
        let keys = crate::nvme_auth::keys_of(&self.home, pool, &v.name)?;
        self.nvmf
            .add_subsystem_with_keys(
                millrace_nvmf::SubsystemConfig {
                    nqn: c.nqn.clone(),
                    serial,
                    model: "Millrace Volume".into(),
                    namespaces: vec![millrace_nvmf::Namespace {
                        nsid: 1,
                        dev,
                        uuid: uuid_bytes(v),
                        nguid: uuid_bytes(v),
                        ana_group: c.ana_group,
                    }],
                    allowed_hosts: c.hosts.clone(),
                    allow_any_host: c.allow_any_host,
                },
                keys,
            )
            .map_err(|e| ApiError::conflict(e.to_string()))?;
        for (host, psk) in crate::nvme_tls::psks_of(&self.home, pool, &v.name)? {
            (self.nvmf)
                .set_host_tls_psk(&c.nqn, &host, Some(psk))
                .map_err(|e| ApiError::conflict(e.to_string()))?;
        }
        // Path states an operator set hold again, from when their listeners start.
        for p in &c.ana_states {
            let restored = ana_path(&p.transport, &p.listener).and_then(|(t, l)| {
                let st: millrace_nvmf::AnaState = p.state.parse().map_err(ApiError::bad_request)?;
                (self.nvmf)
                    .restore_ana_state(&c.nqn, t, l, c.ana_group, st)
                    .map_err(|e| ApiError::bad_request(e.to_string()))
            });
            if let Err(err) = restored {
                tracing::warn!(pool, volume = %v.name, listener = %p.listener, "the path's ANA state is not restored: {}", err.message);
            }
        }
        // Reservations a host asked to persist come back before any host can connect.
        let uuid = v.uuid.to_string();
        if let Some((nsid, st)) = self.resv_files.attach(&c.nqn, pool, &v.name, &uuid) {
            match self.nvmf.restore_reservations(&c.nqn, nsid, st) {
                Ok(()) => tracing::info!(pool, volume = %v.name, "NVMe reservations restored"),
                Err(err) => {
                    tracing::error!(pool, volume = %v.name, "{err}; the export starts without reservations")
                }
            }
        }
        Ok(())
    }

    pub(crate) fn start_nbd(
        &self,
        pool: &str,
        e: &PoolEntry,
        v: &VolumeInfo,
        c: &NbdExportConfig,
    ) -> Result<(), ApiError> {
        let allowed = parse_clients(&c.clients)?;
        if c.listen.is_some() && c.clients.is_empty() {
            return Err(ApiError::bad_request(format!(
                "exports are closed by default: an NBD export listening on TCP needs --client ADDR (an address or a network such as 10.0.0.0/24) for {pool}/{}",
                v.name
            )));
        }
        let dev = self.metered(pool, e, v)?;
        let mut tasks = Vec::new();
        if let Some(addr) = c.listen {
            let l = std::net::TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|_| l))
                .and_then(tokio::net::TcpListener::from_std)
                .map_err(|e| ApiError::conflict(format!("cannot listen for NBD on {addr}: {e}")))?;
            let (s, name) = (self.nbd.clone(), c.name.clone());
            // An export's own port serves that export alone (the shared one serves all).
            tasks.push(tokio::spawn(
                async move { s.serve_tcp_only(l, &name).await },
            ));
        }
        if let Some(path) = &c.socket {
            let l = crate::sockpath::bind(path)
                .and_then(|l| {
                    l.set_nonblocking(true)
                        .and_then(|_| tokio::net::UnixListener::from_std(l))
                        .map_err(|e| format!("cannot listen for NBD on {}: {e}", path.display()))
                })
                .map_err(|e| {
                    for t in &tasks {
                        t.abort();
                    }
                    crate::sockpath::remove(path);
                    ApiError::conflict(e)
                })?;
            let (s, name) = (self.nbd.clone(), c.name.clone());
            tasks.push(tokio::spawn(
                async move { s.serve_unix_only(l, &name).await },
            ));
        }
        let added = self
            .nbd
            .add_export(millrace_nbd::Export {
                name: c.name.clone(),
                description: format!("Millrace volume {pool}/{}", v.name),
                dev,
                read_only: false,
                allowed,
            })
            .map_err(|e| ApiError::conflict(e.to_string()));
        match added {
            Ok(()) => {
                self.nbd_listeners.lock().insert(c.name.clone(), tasks);
                Ok(())
            }
            Err(e) => {
                for t in tasks {
                    t.abort();
                }
                if let Some(p) = &c.socket {
                    crate::sockpath::remove(p);
                }
                Err(e)
            }
        }
    }

    fn stop_nbd(&self, c: &NbdExportConfig) {
        let _ = self.nbd.remove_export(&c.name);
        for t in self
            .nbd_listeners
            .lock()
            .remove(&c.name)
            .unwrap_or_default()
        {
            t.abort();
        }
        if let Some(p) = &c.socket {
            crate::sockpath::remove(p);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn add_nvme_export(
        &self,
        pool: &str,
        vol: &str,
        nqn: Option<String>,
        hosts: Vec<String>,
        allow_any_host: bool,
        ana_group: Option<u32>,
        keys: Option<millrace_nvmf::dhchap::HostKeys>,
    ) -> Result<NvmeExportConfig, ApiError> {
        let (e, v) = self.volume(pool, vol)?;
        let ana_group = ana_group.unwrap_or(1);
        if !(1..=millrace_nvmf::ANA_GROUP_MAX).contains(&ana_group) {
            return Err(ApiError::bad_request(format!(
                "ANA group {ana_group} is out of range; give --ana-group 1 to {}",
                millrace_nvmf::ANA_GROUP_MAX
            )));
        }
        if v.props.contains_key(NVME_PROP) {
            return Err(ApiError::conflict(format!(
                "volume {pool}/{vol} is already exported over NVMe/TCP; remove that export first to change it"
            )));
        }
        if hosts.is_empty() && !allow_any_host {
            return Err(ApiError::bad_request(format!(
                "exports are closed by default: name the hosts that may connect (--host NQN, the host's /etc/nvme/hostnqn), or say --allow-any-host to open {pool}/{vol} to every host"
            )));
        }
        for h in &hosts {
            check_nqn("the host NQN", h)?;
        }
        let nqn = nqn.unwrap_or_else(|| default_nqn(pool, vol));
        check_nqn("the subsystem NQN", &nqn)?;
        if self.nvmf.subsystems().iter().any(|s| s.nqn == nqn) {
            return Err(ApiError::conflict(format!(
                "the subsystem NQN {nqn} is already in use by another export; pick another with --nqn"
            )));
        }
        let c = NvmeExportConfig {
            nqn,
            hosts,
            allow_any_host,
            ana_group,
            ana_states: Vec::new(),
        };
        if let Some(k) = &keys {
            if c.hosts.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "a DH-HMAC-CHAP secret is for named hosts: give --host NQN for {pool}/{vol}"
                )));
            }
            // A new export starts with these secrets alone (none left from an earlier one).
            crate::nvme_auth::forget(&self.home, pool, vol, None)?;
            crate::nvme_auth::record(&self.home, pool, vol, &c.hosts, k)?;
        }
        let undo = |s: &Self| {
            if keys.is_some() {
                let _ = crate::nvme_auth::forget(&s.home, pool, vol, None);
            }
        };
        if self.serving {
            if let Err(err) = self.start_nvme(pool, &e, &v, &c) {
                undo(self);
                return Err(err);
            }
        }
        // Recorded only once it serves, and withdrawn if it cannot be recorded: nothing half-applied.
        if let Err(err) =
            e.volumes
                .set_prop(vol, NVME_PROP, Some(&serde_json::to_string(&c).unwrap()))
        {
            let _ = self.nvmf.remove_subsystem(&c.nqn);
            undo(self);
            return Err(ApiError::internal(err.to_string()));
        }
        Ok(c)
    }

    pub fn remove_nvme_export(&self, pool: &str, vol: &str) -> Result<(), ApiError> {
        let (e, v) = self.volume(pool, vol)?;
        let Some(c) = v.props.get(NVME_PROP) else {
            return Err(ApiError::not_found(format!(
                "volume {pool}/{vol} is not exported over NVMe/TCP"
            )));
        };
        let c: Option<NvmeExportConfig> = serde_json::from_str(c).ok();
        e.volumes
            .set_prop(vol, NVME_PROP, None)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        if let Some(c) = c {
            let _ = self.nvmf.remove_subsystem(&c.nqn);
            self.resv_files.detach(&c.nqn);
        }
        // Its reservations go with it: a new export of the volume starts without them.
        if let Err(err) = self.resv_files.forget(&v.uuid.to_string()) {
            tracing::warn!(
                pool,
                volume = vol,
                "cannot remove the export's reservation record: {err}"
            );
        }
        crate::nvme_auth::forget(&self.home, pool, vol, None)?;
        crate::nvme_tls::set(&self.home, pool, vol, None, None)?;
        Ok(())
    }

    /// Lets one more host connect to a volume's NVMe/TCP export, live and recorded; a host
    /// already there changes nothing (an orchestrator's retry is harmless).
    pub fn add_nvme_host(
        &self,
        pool: &str,
        vol: &str,
        host: &str,
    ) -> Result<NvmeExportConfig, ApiError> {
        check_nqn("the host NQN", host)?;
        self.change_nvme_hosts(pool, vol, |hosts| {
            if !hosts.iter().any(|h| h == host) {
                hosts.push(host.to_string());
            }
        })
    }

    /// Takes one host off a volume's NVMe/TCP export and disconnects it; the export stays,
    /// for its other hosts (or for none). A host not on it changes nothing.
    pub fn remove_nvme_host(
        &self,
        pool: &str,
        vol: &str,
        host: &str,
    ) -> Result<NvmeExportConfig, ApiError> {
        let c = self.change_nvme_hosts(pool, vol, |hosts| hosts.retain(|h| h != host))?;
        // Its secrets go with it: allowed again later, it starts without.
        if self.serving {
            let _ = self.nvmf.set_host_keys(&c.nqn, host, None);
            let _ = self.nvmf.set_host_tls_psk(&c.nqn, host, None);
        }
        crate::nvme_auth::forget(&self.home, pool, vol, Some(host))?;
        crate::nvme_tls::set(&self.home, pool, vol, Some(host), None)?;
        Ok(c)
    }

    fn change_nvme_hosts(
        &self,
        pool: &str,
        vol: &str,
        change: impl FnOnce(&mut Vec<String>),
    ) -> Result<NvmeExportConfig, ApiError> {
        // Read, change and record as one step: two hosts added at once must both stay.
        let _one_at_a_time = HOST_CHANGES.lock().unwrap_or_else(|e| e.into_inner());
        let (e, v) = self.volume(pool, vol)?;
        let old = nvme_config(&v, pool, vol, EXPORT_FIRST)?;
        let mut c = old.clone();
        change(&mut c.hosts);
        if c == old {
            return Ok(c);
        }
        let live = self.serving && self.nvmf.subsystems().iter().any(|s| s.nqn == c.nqn);
        if live {
            self.nvmf
                .set_allowed_hosts(&c.nqn, c.hosts.clone())
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        // Recorded, or the live change is undone: what serves is what the volume says.
        if let Err(err) =
            e.volumes
                .set_prop(vol, NVME_PROP, Some(&serde_json::to_string(&c).unwrap()))
        {
            if live {
                let _ = self.nvmf.set_allowed_hosts(&c.nqn, old.hosts);
            }
            return Err(ApiError::internal(err.to_string()));
        }
        Ok(c)
    }

    /// Sets the ANA state of an NVMe export's group on one path (listener); hosts connected
    /// through it are told at once. Recorded with the export: a server started again on the
    /// same listener address serves the same state there.
    pub fn set_nvme_ana(
        &self,
        pool: &str,
        vol: &str,
        r: &AnaRequest,
    ) -> Result<NvmeExportView, ApiError> {
        let (e, v) = self.volume(pool, vol)?;
        let c = nvme_config(&v, pool, vol, EXPORT_FIRST)?;
        let state: millrace_nvmf::AnaState = r.state.parse().map_err(ApiError::bad_request)?;
        let (transport, listener) = ana_path(r.transport.as_deref().unwrap_or("tcp"), &r.listener)?;
        if !self.serving {
            return Err(ApiError::conflict(
                "ANA states are held by the running server; start `millrace serve` first"
                    .to_string(),
            ));
        }
        (self.nvmf)
            .set_ana_state(&c.nqn, transport, listener, c.ana_group, state)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        // Recorded with the export, so a restart on the same listeners serves it again.
        let mut c = c;
        let t = transport.as_str().to_string();
        (c.ana_states).retain(|p| {
            !(p.transport == t && ana_path(&t, &p.listener).is_ok_and(|(_, l)| l == listener))
        });
        if state != millrace_nvmf::AnaState::Optimized {
            c.ana_states.push(crate::props::AnaPathState {
                transport: t,
                listener: listener.to_string(),
                state: state.as_str().to_string(),
            });
        }
        if let Err(err) =
            (e.volumes).set_prop(vol, NVME_PROP, Some(&serde_json::to_string(&c).unwrap()))
        {
            return Err(ApiError::internal(format!(
                "the path is {state} now, but a restart will make it optimized again: cannot record it with the export ({err})"
            )));
        }
        let subs = self.nvmf.subsystems();
        let live = subs.iter().find(|s| s.nqn == c.nqn);
        let resv = self.reservation_of(&c.nqn);
        Ok(nvme_view(self, pool, vol, c, live, true, resv))
    }

    /// The reservations of a live export's namespace.
    fn reservation_of(&self, nqn: &str) -> Option<NvmeReservation> {
        let all = self.nvmf.reservations(nqn).ok()?;
        all.into_iter().next().map(|(_, st)| reservation_view(&st))
    }

    /// Clears an NVMe export's reservation and every registration: the operator's override
    /// when a cluster that held it is gone. Registered hosts are told their reservation was
    /// preempted; a state that persisted is recorded cleared.
    pub fn clear_nvme_reservation(
        &self,
        pool: &str,
        vol: &str,
    ) -> Result<NvmeExportView, ApiError> {
        let (_, v) = self.volume(pool, vol)?;
        let c = nvme_config(&v, pool, vol, ", so it has no reservation to clear")?;
        if !self.serving {
            return Err(ApiError::conflict(
                "NVMe reservations are held by the running server; start `millrace serve` first"
                    .to_string(),
            ));
        }
        (self.nvmf)
            .clear_reservations(&c.nqn, 1)
            .map_err(|e| ApiError::conflict(e.to_string()))?;
        tracing::warn!(
            pool,
            volume = vol,
            "NVMe reservations cleared by the operator"
        );
        let subs = self.nvmf.subsystems();
        let live = subs.iter().find(|s| s.nqn == c.nqn);
        let resv = self.reservation_of(&c.nqn);
        Ok(nvme_view(self, pool, vol, c, live, true, resv))
    }

    pub fn add_nbd_export(
        &self,
        pool: &str,
        vol: &str,
        name: Option<String>,
        clients: Vec<String>,
        listen: Option<std::net::SocketAddr>,
        socket: Option<std::path::PathBuf>,
    ) -> Result<NbdExportConfig, ApiError> {
        let (e, v) = self.volume(pool, vol)?;
        if v.props.contains_key(NBD_PROP) {
            return Err(ApiError::conflict(format!(
                "volume {pool}/{vol} is already exported over NBD; remove that export first to change it"
            )));
        }
        let c = NbdExportConfig {
            name: name.unwrap_or_else(|| format!("{pool}/{vol}")),
            clients,
            listen,
            socket,
        };
        if self.nbd.exports().iter().any(|x| x.name == c.name) {
            return Err(ApiError::conflict(format!(
                "the NBD export name {} is already in use; pick another with --name",
                c.name
            )));
        }
        parse_clients(&c.clients)?;
        if c.listen.is_some() && c.clients.is_empty() {
            return Err(ApiError::bad_request(format!(
                "exports are closed by default: an NBD export listening on TCP needs --client ADDR (an address or a network such as 10.0.0.0/24) for {pool}/{vol}"
            )));
        }
        if self.serving {
            self.start_nbd(pool, &e, &v, &c)?;
        }
        if let Err(err) =
            e.volumes
                .set_prop(vol, NBD_PROP, Some(&serde_json::to_string(&c).unwrap()))
        {
            self.stop_nbd(&c);
            return Err(ApiError::internal(err.to_string()));
        }
        Ok(c)
    }

    pub fn remove_nbd_export(&self, pool: &str, vol: &str) -> Result<(), ApiError> {
        let (_, v) = self.volume(pool, vol)?;
        if v.props.contains_key(SHARE_PROP) {
            return Err(ApiError::conflict(format!(
                "the NBD export of {pool}/{vol} carries its NFS share; `millrace share delete {pool}/{vol}` removes both"
            )));
        }
        self.drop_nbd_export(pool, vol)
    }

    /// Removes the NBD export whatever sits on it (the share code takes its own down first).
    pub(crate) fn drop_nbd_export(&self, pool: &str, vol: &str) -> Result<(), ApiError> {
        let (e, v) = self.volume(pool, vol)?;
        let Some(c) = v.props.get(NBD_PROP) else {
            return Err(ApiError::not_found(format!(
                "volume {pool}/{vol} is not exported over NBD"
            )));
        };
        let c: Option<NbdExportConfig> = serde_json::from_str(c).ok();
        e.volumes
            .set_prop(vol, NBD_PROP, None)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        if let Some(c) = c {
            self.stop_nbd(&c);
        }
        Ok(())
    }

    /// Every export with who is connected, for the API and the dashboard.
    pub fn exports_view(&self) -> ExportsView {
        let subs = self.nvmf.subsystems();
        let listening = self
            .nvme_listening
            .load(std::sync::atomic::Ordering::Relaxed)
            || !self.nvme_rdma.lock().is_empty();
        let mut view = ExportsView::default();
        for e in self.entries() {
            let pool = e.pool.name();
            for v in e.volumes.list() {
                if let Some(c) = v
                    .props
                    .get(NVME_PROP)
                    .and_then(|c| serde_json::from_str::<NvmeExportConfig>(c).ok())
                {
                    let live = subs.iter().find(|s| s.nqn == c.nqn);
                    let resv = live.and_then(|_| self.reservation_of(&c.nqn));
                    view.nvme
                        .push(nvme_view(self, &pool, &v.name, c, live, listening, resv));
                }
                if let Some(c) = v
                    .props
                    .get(NBD_PROP)
                    .and_then(|c| serde_json::from_str::<NbdExportConfig>(c).ok())
                {
                    let stats = self.nbd.export_stats(&c.name);
                    view.nbd.push(NbdExportView {
                        pool: pool.clone(),
                        volume: v.name.clone(),
                        serving: stats.is_some(),
                        connections: stats.map(|s| s.connections_open).unwrap_or(0),
                        connected: self.nbd.export_clients(&c.name).unwrap_or_default(),
                        name: c.name,
                        clients: c.clients,
                        listen: c.listen.map(|a| a.to_string()),
                        socket: c.socket,
                    });
                }
            }
        }
        view
    }
}

/// In-band authentication (the secrets are kept by `nvme_auth`).
impl State {
    /// Sets or rotates the secrets `host` authenticates with on a volume's NVMe export: live at
    /// once (the host's next authentication uses them) and recorded. The host need not be
    /// allowed yet: setting its secret first means it never connects without one.
    pub fn set_nvme_host_keys(
        &self,
        pool: &str,
        vol: &str,
        host: &str,
        secret: &str,
        ctrl: Option<&str>,
    ) -> Result<NvmeExportView, ApiError> {
        check_nqn("the host NQN", host)?;
        let keys = crate::nvme_auth::parse_keys(secret, ctrl)?;
        let (_, v) = self.volume(pool, vol)?;
        let c = nvme_config(&v, pool, vol, EXPORT_FIRST)?;
        let live = self.serving && self.nvmf.subsystems().iter().any(|s| s.nqn == c.nqn);
        let old = crate::nvme_auth::keys_of(&self.home, pool, vol)?
            .into_iter()
            .find(|(h, _)| h == host)
            .map(|(_, k)| k);
        if live {
            (self.nvmf)
                .set_host_keys(&c.nqn, host, Some(keys.clone()))
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        if let Err(e) = crate::nvme_auth::set(&self.home, pool, vol, host, &keys) {
            if live {
                let _ = self.nvmf.set_host_keys(&c.nqn, host, old);
            }
            return Err(e);
        }
        let subs = self.nvmf.subsystems();
        let live = subs.iter().find(|s| s.nqn == c.nqn);
        let resv = live.and_then(|_| self.reservation_of(&c.nqn));
        Ok(nvme_view(self, pool, vol, c, live, self.serving, resv))
    }

    /// Sets or replaces the TLS PSK a host proves itself with on listeners that require TLS,
    /// live (its next handshake uses it) and recorded.
    pub fn set_nvme_host_tls_psk(
        &self,
        pool: &str,
        vol: &str,
        host: &str,
        psk: &str,
    ) -> Result<(), ApiError> {
        check_nqn("the host NQN", host)?;
        let key = crate::nvme_tls::parse(psk)?;
        let (_, v) = self.volume(pool, vol)?;
        let c = nvme_config(&v, pool, vol, EXPORT_FIRST)?;
        crate::nvme_tls::set(&self.home, pool, vol, Some(host), Some(psk))?;
        if self.serving && self.nvmf.subsystems().iter().any(|s| s.nqn == c.nqn) {
            (self.nvmf)
                .set_host_tls_psk(&c.nqn, host, Some(key))
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        Ok(())
    }

    /// The export's view, as `set_nvme_host_keys` returns it.
    pub fn nvme_export_view(&self, pool: &str, vol: &str) -> Result<NvmeExportView, ApiError> {
        let (_, v) = self.volume(pool, vol)?;
        let c = nvme_config(&v, pool, vol, EXPORT_FIRST)?;
        let subs = self.nvmf.subsystems();
        let live = subs.iter().find(|s| s.nqn == c.nqn);
        let resv = live.and_then(|_| self.reservation_of(&c.nqn));
        Ok(nvme_view(self, pool, vol, c, live, self.serving, resv))
    }
}

/// An NVMe export as the API shows it: its settings, and when live its connections and paths.
/// What a refusal says after "volume P/V is not exported over NVMe/TCP" when the request needs
/// an export (`{pool}` and `{vol}` stand for the volume).
const EXPORT_FIRST: &str = "; export it first (`millrace export nvme add {pool}/{vol} --host NQN`)";

/// The volume's NVMe/TCP export, or a refusal saying it has none, followed by `then`.
fn nvme_config(
    v: &VolumeInfo,
    pool: &str,
    vol: &str,
    then: &str,
) -> Result<NvmeExportConfig, ApiError> {
    (v.props.get(NVME_PROP))
        .and_then(|c| serde_json::from_str(c).ok())
        .ok_or_else(|| {
            let then = then.replace("{pool}", pool).replace("{vol}", vol);
            ApiError::not_found(format!(
                "volume {pool}/{vol} is not exported over NVMe/TCP{then}"
            ))
        })
}

pub(crate) fn nvme_view(
    state: &State,
    pool: &str,
    vol: &str,
    c: NvmeExportConfig,
    live: Option<&millrace_nvmf::SubsystemInfo>,
    listening: bool,
    reservation: Option<NvmeReservation>,
) -> NvmeExportView {
    let connections = (live.iter().flat_map(|s| s.hosts.iter()))
        .map(|h| NvmeConnection {
            host: h.hostnqn.clone(),
            peer: h.peer.to_string(),
            io_queues: h.io_queues,
            transport: h.transport.as_str().to_string(),
            listener: h.listener.map(|a| a.to_string()),
            tls: h.tls,
        })
        .collect();
    let paths = (live.iter().flat_map(|s| s.paths.iter()))
        .filter(|p| p.ana_group == c.ana_group)
        .map(|p| NvmePath {
            transport: p.transport.as_str().to_string(),
            listener: p.listener.to_string(),
            state: p.state.as_str().to_string(),
        })
        .collect();
    NvmeExportView {
        dhchap: crate::nvme_auth::modes(&state.home, pool, vol, &c.hosts),
        tls_psk: crate::nvme_tls::hosts(&state.home, pool, vol),
        pool: pool.to_string(),
        volume: vol.to_string(),
        nqn: c.nqn,
        hosts: c.hosts,
        allow_any_host: c.allow_any_host,
        serving: live.is_some() && listening,
        connections,
        ana_group: c.ana_group,
        paths,
        reservation,
    }
}

fn reservation_view(st: &millrace_nvmf::ReservationState) -> NvmeReservation {
    use crate::nvme_resv::{hex, key_text};
    let holder = (st.holder.as_ref())
        .and_then(|h| st.registrants.iter().find(|r| r.hostid == *h))
        .map(|r| r.hostnqn.clone());
    NvmeReservation {
        rtype: st.rtype.map(|t| t.as_str().to_string()),
        holder,
        registrants: (st.registrants.iter())
            .map(|r| NvmeRegistrant {
                host: r.hostnqn.clone(),
                hostid: hex(&r.hostid),
                key: key_text(r.key),
                holds: st.holds(&r.hostid),
            })
            .collect(),
        generation: st.generation,
        ptpl: st.ptpl,
    }
}

fn parse_clients(clients: &[String]) -> Result<Vec<millrace_nbd::IpNet>, ApiError> {
    clients
        .iter()
        .map(|c| {
            c.parse::<millrace_nbd::IpNet>()
                .or_else(|_| c.parse::<std::net::IpAddr>().map(millrace_nbd::IpNet::from))
                .map_err(|_| {
                    ApiError::bad_request(format!(
                        "'{c}' is not an address or network; write it like 10.0.0.5 or 10.0.0.0/24"
                    ))
                })
        })
        .collect()
}

/// A path as the API names it: a transport (tcp or rdma) and a listener, ADDR:PORT.
fn ana_path(
    transport: &str,
    listener: &str,
) -> Result<(millrace_nvmf::Transport, std::net::SocketAddr), ApiError> {
    let t = match transport {
        "tcp" => millrace_nvmf::Transport::Tcp,
        "rdma" => millrace_nvmf::Transport::Rdma,
        t => {
            return Err(ApiError::bad_request(format!(
                "'{t}' is not an NVMe transport; use tcp or rdma"
            )))
        }
    };
    let l = listener.trim().parse().map_err(|_| {
        ApiError::bad_request(format!(
            "'{listener}' is not a listener address; write it as ADDR:PORT, as `millrace export list` shows the export's paths"
        ))
    })?;
    Ok((t, l))
}
