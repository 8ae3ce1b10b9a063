//! The target's public face: subsystems, namespaces and allow-lists managed live, counters,
//! the listeners of each transport (the discovery log names them), and the NVMe/TCP accept
//! loop. Another transport (NVMe/RDMA) runs its own listener and asks for a [`Session`] per
//! queue.

use crate::ana::AnaState;
use crate::error::Error;
use crate::model::{
    Controllers, Counters, HostInfo, Inner, IoCounters, Namespace, NamespaceInfo, Ns, PathInfo,
    Port, Stats, Subsystem, SubsystemConfig, SubsystemInfo, TargetConfig, Transport, DISCOVERY_NQN,
};
use crate::reservation::{ReservationState, ReservationStore};
use crate::session::Session;
use crate::tcp;
use crate::tls::TlsMode;
use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[path = "target_auth.rs"]
mod auth;

/// An NVMe-oF target (NVMe/TCP here, other transports through [`Target::session`]). Cheap to clone; every clone is the same target.
#[derive(Clone)]
pub struct Target {
    pub(crate) inner: Arc<Inner>,
}

fn check_nqn(nqn: &str) -> Result<(), Error> {
    if nqn.is_empty() || nqn.len() > crate::cmd::NQN_MAX || nqn.contains('\0') {
        return Err(Error::Invalid(format!(
            "the NQN {nqn:?} must be 1 to {} bytes without NUL characters",
            crate::cmd::NQN_MAX
        )));
    }
    Ok(())
}

impl Target {
    pub fn new(cfg: TargetConfig) -> Target {
        let discovery = Arc::new(Subsystem {
            nqn: DISCOVERY_NQN.into(),
            serial: "millrace-discovery".into(),
            model: "Millrace Discovery".into(),
            allowed_hosts: RwLock::new(Vec::new()),
            allow_any_host: true,
            discovery: true,
            namespaces: ArcSwap::from_pointee(Vec::new()),
            controllers: Mutex::new(Controllers::default()),
            io: IoCounters::default(),
            ana: Default::default(),
            auth: Default::default(),
            tls_psks: Default::default(),
        });
        let admission = millrace_io::admission::Admission::new(
            cfg.max_connections,
            cfg.max_connections_per_address,
        );
        Target {
            inner: Arc::new(Inner {
                cfg,
                subsystems: RwLock::new(HashMap::new()),
                discovery,
                ports: Mutex::new(Vec::new()),
                genctr: AtomicU64::new(1),
                counters: Counters::default(),
                admission,
                refusal_log: Default::default(),
                connect_log: Default::default(),
                data: std::sync::OnceLock::new(),
                epoch: Instant::now(),
                shutdown: CancellationToken::new(),
                host_shares: Default::default(),
                resv_store: std::sync::OnceLock::new(),
                ana_paths: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn config(&self) -> &TargetConfig {
        &self.inner.cfg
    }

    /// Runs the target's NVMe/TCP connections on `cores` (each connection on one core, its
    /// device calls completing there) with their data in `pool`, whose largest buffer caps the
    /// transfer size advertised (MDTS). Call it before `serve`; a second call is refused. A
    /// target given none makes its own pool and serves on the runtime that accepts.
    pub fn set_data_path(
        &self,
        pool: millrace_io::BufPool,
        cores: Option<Arc<millrace_io::Cores>>,
    ) -> Result<(), Error> {
        (self.inner.data)
            .set(crate::model::DataPath { pool, cores })
            .map_err(|_| Error::Invalid("the target's data path is already set".into()))
    }

    /// The cores the target's connections run on, when `set_data_path` gave some (other
    /// transports, NVMe/RDMA, run their queues there too).
    pub fn cores(&self) -> Option<Arc<millrace_io::Cores>> {
        self.inner.data.get().and_then(|d| d.cores.clone())
    }

    /// The pool the target's data buffers come from.
    pub fn pool(&self) -> millrace_io::BufPool {
        self.inner.data().pool.clone()
    }

    pub fn add_subsystem(&self, s: SubsystemConfig) -> Result<(), Error> {
        self.add_subsystem_with_keys(s, Vec::new())
    }

    /// Adds a subsystem whose hosts in `keys` must authenticate (DH-HMAC-CHAP) from their
    /// first Connect on.
    pub fn add_subsystem_with_keys(
        &self,
        s: SubsystemConfig,
        keys: Vec<(String, crate::dhchap::HostKeys)>,
    ) -> Result<(), Error> {
        check_nqn(&s.nqn)?;
        if s.nqn == DISCOVERY_NQN {
            return Err(Error::Invalid(
                "the discovery NQN is reserved for the discovery service".into(),
            ));
        }
        for h in s.allowed_hosts.iter().chain(keys.iter().map(|(h, _)| h)) {
            check_nqn(h)?;
        }
        let mut ns = Vec::new();
        for n in s.namespaces {
            let n = Ns::new(n)?;
            if ns.iter().any(|m: &Arc<Ns>| m.nsid == n.nsid) {
                return Err(Error::NamespaceExists {
                    nqn: s.nqn,
                    nsid: n.nsid,
                });
            }
            ns.push(Arc::new(n));
        }
        ns.sort_by_key(|n| n.nsid);
        let sub = Arc::new(Subsystem {
            nqn: s.nqn.clone(),
            serial: s.serial,
            model: s.model,
            allowed_hosts: RwLock::new(s.allowed_hosts),
            allow_any_host: s.allow_any_host,
            discovery: false,
            namespaces: ArcSwap::from_pointee(ns),
            controllers: Mutex::new(Controllers::default()),
            io: IoCounters::default(),
            ana: Default::default(),
            auth: crate::dhchap::SubsystemAuth {
                keys: RwLock::new(keys.into_iter().collect()),
                ..Default::default()
            },
            tls_psks: Default::default(),
        });
        {
            let mut m = self.inner.subsystems.write();
            if m.contains_key(&s.nqn) {
                return Err(Error::SubsystemExists(s.nqn));
            }
            m.insert(s.nqn, sub);
        }
        self.inner.discovery_changed();
        Ok(())
    }

    /// Removes a subsystem and drops every host connected to it.
    pub fn remove_subsystem(&self, nqn: &str) -> Result<(), Error> {
        let s = self
            .inner
            .subsystems
            .write()
            .remove(nqn)
            .ok_or_else(|| Error::NoSuchSubsystem(nqn.into()))?;
        s.kill_controllers();
        (self.inner.ana_paths.lock()).retain(|(n, ..), _| n != nqn);
        self.inner.discovery_changed();
        Ok(())
    }

    /// The live subsystem `nqn`, or the error that names it.
    pub(crate) fn subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, Error> {
        (self.inner.subsystems.read().get(nqn).cloned())
            .ok_or_else(|| Error::NoSuchSubsystem(nqn.into()))
    }

    /// Replaces the hosts allowed to connect to a live subsystem (its namespaces and the other
    /// hosts' connections stay as they are). A host no longer allowed is disconnected at once,
    /// so taking a host off an export ends its access, not only its next connect.
    pub fn set_allowed_hosts(&self, nqn: &str, hosts: Vec<String>) -> Result<(), Error> {
        for h in &hosts {
            check_nqn(h)?;
        }
        let s = self.subsystem(nqn)?;
        *s.allowed_hosts.write() = hosts;
        let gone: Vec<_> = (s.controllers.lock().by_id.values())
            .filter(|c| !s.host_allowed(&c.hostnqn))
            .cloned()
            .collect();
        for c in gone {
            c.dead.cancel();
        }
        self.inner.discovery_changed();
        Ok(())
    }

    /// The addresses the NVMe/TCP I/O listeners serve on (those `serve` runs on now).
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        (self.listeners().into_iter())
            .filter(|(t, _)| *t == Transport::Tcp)
            .map(|(_, a)| a)
            .collect()
    }

    /// Every I/O listener of every transport, in the order they started.
    pub fn listeners(&self) -> Vec<(Transport, SocketAddr)> {
        (self.inner.ports.lock().iter())
            .map(|p| (p.transport, p.addr))
            .collect()
    }

    /// Names a listener of another transport in the discovery log until the guard drops.
    pub fn add_listener(&self, transport: Transport, addr: SocketAddr) -> ListenerGuard {
        self.add_port(transport, addr, TlsMode::None)
    }

    fn add_port(&self, transport: Transport, addr: SocketAddr, tls: TlsMode) -> ListenerGuard {
        let id = {
            let mut p = self.inner.ports.lock();
            // Port ids stay unique while listeners come and go.
            let id = p
                .iter()
                .map(|p| p.id)
                .max()
                .unwrap_or(0)
                .wrapping_add(1)
                .max(1);
            p.push(Port {
                id,
                addr,
                transport,
                tls,
            });
            id
        };
        // States set for this address before it listened (or while it last did) hold again.
        let remembered: Vec<_> = (self.inner.ana_paths.lock().iter())
            .filter(|((_, t, a, _), _)| *t == transport && *a == addr)
            .map(|((nqn, _, _, g), st)| (nqn.clone(), *g, *st))
            .collect();
        for (nqn, group, state) in remembered {
            if let Ok(s) = self.subsystem(&nqn) {
                s.ana.set(id, group, state);
            }
        }
        self.inner.discovery_changed();
        ListenerGuard {
            t: self.inner.clone(),
            id,
        }
    }

    /// Sets the ANA state of group `group` of subsystem `nqn` as seen through the listener of
    /// `transport` at `listener` (as [`Target::listeners`] names it). Hosts connected through
    /// that listener get an ANA change notice; I/O there to a group inaccessible, lost or in
    /// change completes with a path status, so a host's multipath uses another path.
    pub fn set_ana_state(
        &self,
        nqn: &str,
        transport: Transport,
        listener: SocketAddr,
        group: u32,
        state: AnaState,
    ) -> Result<(), Error> {
        self.ana_state_at(nqn, transport, listener, group, state, true)
    }

    /// As [`Target::set_ana_state`], for a listener that may not have started yet (a server
    /// starting puts back the states an operator set): it holds from when the listener starts.
    pub fn restore_ana_state(
        &self,
        nqn: &str,
        transport: Transport,
        listener: SocketAddr,
        group: u32,
        state: AnaState,
    ) -> Result<(), Error> {
        self.ana_state_at(nqn, transport, listener, group, state, false)
    }

    fn check_ana_group(&self, s: &Subsystem, nqn: &str, group: u32) -> Result<(), Error> {
        let groups = s.ana_groups();
        if groups.iter().any(|(g, _)| *g == group) {
            return Ok(());
        }
        let known: Vec<String> = groups.iter().map(|(g, _)| g.to_string()).collect();
        Err(Error::Invalid(format!(
            "subsystem {nqn} has no namespace in ANA group {group}; its groups are: {}",
            known.join(", ")
        )))
    }

    fn remember_ana(
        &self,
        nqn: &str,
        transport: Transport,
        listener: SocketAddr,
        group: u32,
        state: AnaState,
    ) {
        let key = (nqn.to_string(), transport, listener, group);
        let mut m = self.inner.ana_paths.lock();
        match state {
            AnaState::Optimized => m.remove(&key),
            st => m.insert(key, st),
        };
    }

    fn ana_state_at(
        &self,
        nqn: &str,
        transport: Transport,
        listener: SocketAddr,
        group: u32,
        state: AnaState,
        must_listen: bool,
    ) -> Result<(), Error> {
        let s = self.subsystem(nqn)?;
        let port = (self.inner.ports.lock().iter())
            .find(|p| p.transport == transport && p.addr == listener)
            .map(|p| p.id);
        let Some(port) = port else {
            if !must_listen {
                self.check_ana_group(&s, nqn, group)?;
                self.remember_ana(nqn, transport, listener, group, state);
                return Ok(());
            }
            let known: Vec<String> = (self.listeners().iter())
                .map(|(t, a)| format!("{} {a}", t.as_str()))
                .collect();
            return Err(Error::Invalid(format!(
                "the target has no {} listener on {listener}; its listeners are: {}",
                transport.as_str(),
                match known.is_empty() {
                    true => "none".to_string(),
                    false => known.join(", "),
                }
            )));
        };
        self.check_ana_group(&s, nqn, group)?;
        self.remember_ana(nqn, transport, listener, group, state);
        if s.ana.set(port, group, state) {
            tracing::info!(subsystem = %nqn, %listener, group, state = state.as_str(), "ANA state changed");
            s.ana_changed(port);
        }
        Ok(())
    }

    /// Records namespaces' reservations that persist through power loss with `store` (see
    /// [`ReservationStore`]); without one, hosts cannot ask for persistence (RESCAP bit 0 is
    /// clear). Set it before hosts connect; a second call is refused.
    pub fn set_reservation_store(&self, store: ReservationStore) -> Result<(), Error> {
        (self.inner.resv_store)
            .set(store)
            .map_err(|_| Error::Invalid("the target's reservation store is already set".into()))
    }

    fn subsystem_ns(&self, nqn: &str, nsid: u32) -> Result<(Arc<Subsystem>, Arc<Ns>), Error> {
        let s = self.subsystem(nqn)?;
        let ns = s.ns(nsid).ok_or_else(|| Error::NoSuchNamespace {
            nqn: nqn.into(),
            nsid,
        })?;
        Ok((s, ns))
    }

    /// Puts a recorded reservation state back on a namespace (after a restart, before hosts
    /// come back); a state that does not hold together is refused with a sentence.
    pub fn restore_reservations(
        &self,
        nqn: &str,
        nsid: u32,
        state: ReservationState,
    ) -> Result<(), Error> {
        let (_, ns) = self.subsystem_ns(nqn, nsid)?;
        crate::resv_commands::restore(&ns, state).map_err(|why| {
            Error::Invalid(format!(
                "the recorded reservations of namespace {nsid} of {nqn} do not hold together: {why}"
            ))
        })
    }

    /// Clears a namespace's reservation and every registration, as an operator fencing a
    /// dead cluster does: the registered hosts are told their reservation was preempted, and
    /// the change is recorded. Blocks (the record is written on this thread).
    pub fn clear_reservations(&self, nqn: &str, nsid: u32) -> Result<(), Error> {
        let (s, ns) = self.subsystem_ns(nqn, nsid)?;
        crate::resv_commands::clear(&self.inner, &s, &ns).map_err(Error::Invalid)
    }

    /// Each namespace of a subsystem with its reservations.
    pub fn reservations(&self, nqn: &str) -> Result<Vec<(u32, ReservationState)>, Error> {
        let s = self.subsystem(nqn)?;
        Ok((s.namespaces.load().iter())
            .map(|n| (n.nsid, n.resv.snapshot()))
            .collect())
    }

    /// The command handling of one new queue of another transport (NVMe/RDMA): connect and
    /// admission, admin and I/O commands. `peer` is the host's address, `local` ours.
    pub fn session(&self, peer: SocketAddr, local: Option<SocketAddr>) -> Session {
        Session::new(self.inner.clone(), peer, local, false)
    }

    /// Adds a namespace to a live subsystem; connected hosts get a namespace-changed event.
    pub fn add_namespace(&self, nqn: &str, n: Namespace) -> Result<(), Error> {
        let s = self.subsystem(nqn)?;
        let n = Arc::new(Ns::new(n)?);
        let nsid = n.nsid;
        let mut clash = false;
        s.namespaces.rcu(|cur| {
            let mut v: Vec<Arc<Ns>> = cur.as_ref().clone();
            clash = v.iter().any(|m| m.nsid == nsid);
            if !clash {
                v.push(n.clone());
                v.sort_by_key(|m| m.nsid);
            }
            v
        });
        if clash {
            return Err(Error::NamespaceExists {
                nqn: nqn.into(),
                nsid,
            });
        }
        s.namespaces_changed(nsid);
        Ok(())
    }

    /// Re-reads a namespace's size from its device (after the volume grew) and tells connected
    /// hosts with a namespace-changed event, so they rescan it.
    pub fn resize_namespace(&self, nqn: &str, nsid: u32) -> Result<(), Error> {
        let s = self.subsystem(nqn)?;
        let old = s.ns(nsid).ok_or_else(|| Error::NoSuchNamespace {
            nqn: nqn.into(),
            nsid,
        })?;
        let mut n = Ns::new(Namespace {
            nsid,
            dev: old.dev.clone(),
            uuid: old.uuid,
            nguid: old.nguid,
            ana_group: old.ana_group,
        })?;
        // The same namespace, larger: its registrations and reservation stay.
        n.resv = old.resv.clone();
        let n = Arc::new(n);
        s.namespaces.rcu(|cur| {
            cur.iter()
                .map(|m| if m.nsid == nsid { n.clone() } else { m.clone() })
                .collect::<Vec<_>>()
        });
        s.namespaces_changed(nsid);
        Ok(())
    }

    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> Result<(), Error> {
        let s = self.subsystem(nqn)?;
        let mut found = false;
        s.namespaces.rcu(|cur| {
            let v: Vec<Arc<Ns>> = cur.iter().filter(|m| m.nsid != nsid).cloned().collect();
            found = v.len() != cur.len();
            v
        });
        if !found {
            return Err(Error::NoSuchNamespace {
                nqn: nqn.into(),
                nsid,
            });
        }
        s.namespaces_changed(nsid);
        Ok(())
    }

    pub fn subsystems(&self) -> Vec<SubsystemInfo> {
        let ports: Vec<(u16, Transport, SocketAddr)> = (self.inner.ports.lock().iter())
            .map(|p| (p.id, p.transport, p.addr))
            .collect();
        let mut v: Vec<SubsystemInfo> = self
            .inner
            .subsystems
            .read()
            .values()
            .map(|s| {
                let mut hosts: Vec<HostInfo> = s
                    .controllers
                    .lock()
                    .by_id
                    .values()
                    .map(|c| HostInfo {
                        hostnqn: c.hostnqn.clone(),
                        cntlid: c.cntlid,
                        peer: c.peer,
                        io_queues: c.io_qids.lock().len(),
                        transport: c.transport,
                        listener: ports.iter().find(|p| p.0 == c.port).map(|p| p.2),
                        tls: c.tls,
                    })
                    .collect();
                hosts.sort_by_key(|h| h.cntlid);
                SubsystemInfo {
                    nqn: s.nqn.clone(),
                    serial: s.serial.clone(),
                    model: s.model.clone(),
                    namespaces: s
                        .namespaces
                        .load()
                        .iter()
                        .map(|n| NamespaceInfo {
                            nsid: n.nsid,
                            size_bytes: n.blocks << n.lba_shift,
                            block_bytes: n.block_bytes(),
                            ana_group: n.ana_group,
                        })
                        .collect(),
                    paths: paths_of(s, &ports),
                    allowed_hosts: s.allowed_hosts.read().clone(),
                    allow_any_host: s.allow_any_host,
                    hosts,
                }
            })
            .collect();
        v.sort_by(|a, b| a.nqn.cmp(&b.nqn));
        v
    }

    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = Stats {
            connections_open: self.inner.admission.open() as u64,
            connections_total: r(&c.connections_total),
            connections_refused: r(&c.connections_refused),
            commands: r(&c.commands),
            errors: r(&c.errors),
            protocol_errors: r(&c.protocol_errors),
            timeouts: r(&c.timeouts),
            abandoned: r(&c.abandoned),
            connects_refused_tcp: r(&c.connects_refused_tcp),
            connects_refused_rdma: r(&c.connects_refused_rdma),
            ..Default::default()
        };
        for sub in self.inner.subsystems.read().values() {
            s.controllers += sub.controllers.lock().by_id.len() as u64;
            s.read_commands += r(&sub.io.read_commands);
            s.write_commands += r(&sub.io.write_commands);
            s.bytes_read += r(&sub.io.bytes_read);
            s.bytes_written += r(&sub.io.bytes_written);
        }
        s
    }

    /// Serves NVMe/TCP I/O and discovery on this listener until `shutdown` (one task per
    /// connection). The listener's address becomes a port in the discovery log.
    pub async fn serve(&self, listener: TcpListener) -> io::Result<()> {
        self.serve_with(listener, TlsMode::None).await
    }

    /// `serve`, with every connection on this listener required to open with a TLS 1.3 PSK
    /// handshake when `tls` is `Required` (NVMe/TCP's secure channel; hosts' PSKs are set with
    /// `set_host_tls_psk`). The discovery log names the listener as requiring TLS 1.3.
    pub async fn serve_with(&self, listener: TcpListener, tls: TlsMode) -> io::Result<()> {
        let addr = listener.local_addr()?;
        let _port = self.add_port(Transport::Tcp, addr, tls);
        self.accept_loop(listener, false, tls).await
    }

    /// Serves only the discovery subsystem on this listener (the standard port is 8009).
    pub async fn serve_discovery(&self, listener: TcpListener) -> io::Result<()> {
        self.accept_loop(listener, true, TlsMode::None).await
    }

    /// Cancelled when the target shuts down (other transports' listeners stop with it).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Stops every `serve` loop and drops every connection.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    async fn accept_loop(
        &self,
        listener: TcpListener,
        discovery_only: bool,
        tls: TlsMode,
    ) -> io::Result<()> {
        let mut backoff = millrace_io::admission::AcceptBackoff::default();
        loop {
            let (sock, peer) = tokio::select! {
                _ = self.inner.shutdown.cancelled() => return Ok(()),
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of descriptors (EMFILE, ENFILE) and the like pass: back off (up
                        // to a second) and keep serving the connections already open.
                        let wait = backoff.wait();
                        if let Some(n) = self.inner.refusal_log.allow() {
                            tracing::warn!("accepting an NVMe/TCP connection failed ({n} more not logged): {e}; retrying in {wait:?}");
                        }
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                },
            };
            backoff.reset();
            let Some(slot) = admit(&self.inner, peer) else {
                continue;
            };
            let t = self.inner.clone();
            match &self.inner.data().cores {
                Some(cores) => {
                    // The connection leaves this runtime for a core, where it stays.
                    let Ok(std) = sock.into_std() else { continue };
                    cores.spawn(move || async move {
                        let _slot = slot;
                        match tokio::net::TcpStream::from_std(std) {
                            Ok(sock) => {
                                tcp::serve_connection(t, sock, peer, discovery_only, tls).await
                            }
                            Err(e) => {
                                tracing::warn!(%peer, "cannot serve a connection on a core: {e}")
                            }
                        }
                    });
                }
                None => {
                    tokio::spawn(async move {
                        let _slot = slot;
                        tcp::serve_connection(t, sock, peer, discovery_only, tls).await;
                    });
                }
            }
        }
    }
}

/// Every (listener, ANA group) of a subsystem with the group's state on that path.
fn paths_of(s: &Subsystem, ports: &[(u16, Transport, SocketAddr)]) -> Vec<PathInfo> {
    let groups = s.ana_groups();
    let mut v = Vec::new();
    for &(id, transport, listener) in ports {
        for (g, _) in &groups {
            v.push(PathInfo {
                transport,
                listener,
                ana_group: *g,
                state: s.ana.state(id, *g),
            });
        }
    }
    v
}

/// A connection's place under the target's limits (in total and per source address), given
/// back when the connection ends, on whichever thread that is. The open count in `stats` is
/// read from the admission, so it cannot drift from the places held.
type Admitted = millrace_io::admission::Place<std::net::IpAddr>;

/// A place for a connection from `peer`, or None after counting and logging the refusal.
fn admit(t: &Arc<Inner>, peer: SocketAddr) -> Option<Admitted> {
    let c = &t.counters;
    let place = match t.admission.take(Some(peer.ip())) {
        Ok(p) => p,
        Err(why) => {
            c.connections_refused.fetch_add(1, Ordering::Relaxed);
            if let Some(n) = t.refusal_log.allow() {
                tracing::warn!(%peer, "refusing an NVMe/TCP connection: {why} ({n} more refusals not logged)");
            }
            return None;
        }
    };
    c.connections_total.fetch_add(1, Ordering::Relaxed);
    Some(place)
}

/// A listener named in the discovery log; dropping it takes the name out.
pub struct ListenerGuard {
    t: Arc<Inner>,
    id: u16,
}

impl Drop for ListenerGuard {
    fn drop(&mut self) {
        self.t.ports.lock().retain(|p| p.id != self.id);
        for s in self.t.subsystems.read().values() {
            s.ana.forget_port(self.id);
        }
        self.t.discovery_changed();
    }
}
