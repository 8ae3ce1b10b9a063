//! Long work (rebuilds, scrubs) runs on its own thread; the API and the dashboard follow it here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

/// A rebuild, scrub or bench run, running or finished.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    pub id: u64,
    /// rebuild, scrub or bench.
    pub kind: String,
    pub pool: String,
    /// running, done or failed.
    pub state: String,
    pub done: u64,
    pub total: u64,
    pub percent: f64,
    pub message: String,
    /// What the job found (a scrub's counts, a bench run's results and table).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub result: Option<serde_json::Value>,
}

pub struct Job {
    view: Mutex<JobView>,
}

impl Job {
    pub fn progress(&self, done: u64, total: u64) {
        let mut v = self.view.lock();
        v.done = done;
        v.total = total;
        v.percent = if total > 0 {
            (done as f64 * 100.0 / total as f64 * 10.0).round() / 10.0
        } else {
            0.0
        };
    }
    pub fn set_result(&self, r: serde_json::Value) {
        self.view.lock().result = Some(r);
    }
}

#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
}

impl Jobs {
    /// Runs `work` on a thread of its own; its Ok is the job's closing message, its Err the
    /// sentence saying why it failed.
    pub fn spawn(
        &self,
        pool: &str,
        kind: &str,
        work: impl FnOnce(&Job) -> Result<String, String> + Send + 'static,
    ) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let job = Arc::new(Job {
            view: Mutex::new(JobView {
                id,
                kind: kind.into(),
                pool: pool.into(),
                state: "running".into(),
                done: 0,
                total: 0,
                percent: 0.0,
                message: String::new(),
                result: None,
            }),
        });
        self.jobs.lock().insert(id, job.clone());
        let name = format!("{kind}-{pool}");
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let r = work(&job);
                let mut v = job.view.lock();
                match r {
                    Ok(m) => {
                        v.state = "done".into();
                        v.percent = 100.0;
                        v.message = m;
                    }
                    Err(m) => {
                        tracing::error!(job = id, "{m}");
                        v.state = "failed".into();
                        v.message = m;
                    }
                }
            })
            .expect("a thread for the job");
        id
    }

    pub fn list(&self) -> Vec<JobView> {
        self.jobs
            .lock()
            .values()
            .map(|j| j.view.lock().clone())
            .collect()
    }

    pub fn get(&self, id: u64) -> Option<JobView> {
        self.jobs.lock().get(&id).map(|j| j.view.lock().clone())
    }

    pub fn running_id(&self, pool: &str, kind: &str) -> Option<u64> {
        self.list()
            .into_iter()
            .find(|j| j.pool == pool && j.kind == kind && j.state == "running")
            .map(|j| j.id)
    }

    pub fn running_id_of_kind(&self, kind: &str) -> Option<u64> {
        self.list()
            .into_iter()
            .find(|j| j.kind == kind && j.state == "running")
            .map(|j| j.id)
    }

    pub fn running_for(&self, pool: &str) -> bool {
        self.list()
            .iter()
            .any(|j| j.pool == pool && j.state == "running")
    }
}
