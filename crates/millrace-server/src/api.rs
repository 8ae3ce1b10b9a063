//! The HTTP API: JSON under /api/v1, /metrics, and the dashboard at /. Refusals are
//! `{"error": "sentence"}` with 400 (bad request), 401 (token), 404 (no such thing) or 409
//! (conflicts with the current state); a refused request changes nothing.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::state::{CreatePool, State};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: m.into(),
        }
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: m.into(),
        }
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            message: m.into(),
        }
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: m.into(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

type S = AxState<Arc<State>>;
type R = Result<Json<Value>, ApiError>;

/// Runs blocking pool work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("the request's worker failed: {e}")))?
}

fn to_json<T: serde::Serialize>(v: T) -> R {
    Ok(Json(
        serde_json::to_value(v).map_err(|e| ApiError::internal(e.to_string()))?,
    ))
}

/// JSON bodies whose problems come back as our 400 sentence, not axum's plain text.
pub struct Body<T>(pub T);

impl<T: serde::de::DeserializeOwned, St: Send + Sync> axum::extract::FromRequest<St> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, st: &St) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, st).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(e) => Err(ApiError::bad_request(format!(
                "the request body is not what this call takes: {}; send JSON as /api/v1/openapi.json describes",
                e.body_text()
            ))),
        }
    }
}

/// Query strings whose problems come back as our 400 sentence.
pub struct Q<T>(pub T);

impl<T: serde::de::DeserializeOwned, St: Send + Sync> axum::extract::FromRequestParts<St> for Q<T> {
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &St,
    ) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, st).await {
            Ok(Query(v)) => Ok(Q(v)),
            Err(e) => Err(ApiError::bad_request(format!(
                "the query string is not what this call takes: {}; /api/v1/openapi.json lists its parameters",
                e.body_text()
            ))),
        }
    }
}

/// Path parameters whose problems come back as our 400 sentence.
pub struct P<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send, St: Send + Sync> axum::extract::FromRequestParts<St>
    for P<T>
{
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &St,
    ) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, st).await {
            Ok(Path(v)) => Ok(P(v)),
            Err(e) => Err(ApiError::bad_request(format!(
                "the path is not what this call takes: {}; /api/v1/openapi.json lists the calls",
                e.body_text()
            ))),
        }
    }
}

pub fn router(state: Arc<State>, token: Option<String>) -> Router {
    let api = Router::new()
        .route("/api/v1/status", get(status))
        .route("/api/v1/pools", get(pools).post(create_pool))
        .route("/api/v1/pools/import", post(import))
        .route("/api/v1/pools/{pool}", get(pool).delete(destroy_pool))
        .route(
            "/api/v1/pools/{pool}/data",
            get(read_data)
                .put(write_data)
                .layer(axum::extract::DefaultBodyLimit::max(
                    crate::state::MAX_RAW_IO as usize,
                )),
        )
        .route("/api/v1/pools/{pool}/fail", post(fail))
        .route("/api/v1/pools/{pool}/spares", post(add_spare))
        .route("/api/v1/pools/{pool}/replace", post(replace))
        .route("/api/v1/pools/{pool}/scrub", post(scrub))
        .route("/api/v1/pools/{pool}/rebuild", post(rebuild))
        .route(
            "/api/v1/pools/{pool}/volumes",
            get(volumes).post(create_volume),
        )
        .route(
            "/api/v1/pools/{pool}/volumes/{vol}",
            get(volume).patch(grow_volume).delete(delete_volume),
        )
        .route("/api/v1/jobs", get(jobs))
        .route("/api/v1/bench", post(bench))
        .route("/api/v1/jobs/{id}", get(job))
        .route("/api/v1/exports", get(exports))
        .route("/api/v1/exports/nvme", post(add_nvme))
        .route(
            "/api/v1/exports/nvme/{pool}/{vol}",
            axum::routing::delete(remove_nvme),
        )
        .route(
            "/api/v1/exports/nvme/{pool}/{vol}/hosts/{host}",
            axum::routing::put(add_nvme_host).delete(remove_nvme_host),
        )
        .route("/api/v1/exports/nbd", post(add_nbd))
        .route(
            "/api/v1/exports/nbd/{pool}/{vol}",
            axum::routing::delete(remove_nbd),
        )
        .route("/api/v1/shares", get(shares).post(create_share))
        .route(
            "/api/v1/shares/{pool}/{vol}",
            axum::routing::delete(delete_share),
        )
        .route("/api/v1/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method);
    let guarded = match token {
        Some(t) => api.layer(middleware::from_fn_with_state(Arc::new(t), require_token)),
        None => api,
    };
    // The page itself is public (it holds no data); everything it shows comes through the API.
    Router::new()
        .route("/", get(index))
        .merge(guarded)
        .with_state(state)
}

async fn require_token(
    AxState(token): AxState<Arc<String>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => next.run(req).await,
        Some(_) => (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "the bearer token is wrong; use the one in the server's --token-file"})),
        )
            .into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({"error": "this server needs a token: send the header 'Authorization: Bearer TOKEN' (the CLI reads MILLRACE_TOKEN)"})),
        )
            .into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found() -> ApiError {
    ApiError::not_found("there is no such API call; /api/v1/openapi.json lists them")
}

async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!(
            "{} does not take {method}; /api/v1/openapi.json lists the methods each path takes",
            uri.path()
        ),
    }
}

async fn index() -> Html<&'static str> {
    Html(include_str!("index.html"))
}

async fn openapi() -> Json<Value> {
    Json(crate::openapi::document())
}

async fn metrics(AxState(s): S) -> Response {
    let body = tokio::task::spawn_blocking(move || crate::metrics::render(&s))
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn status(AxState(s): S) -> R {
    blocking(move || {
        let entries = s.entries();
        let volumes: usize = entries.iter().map(|e| e.volumes.list().len()).sum();
        let ex = s.exports_view();
        let exports = ex["nvme"].as_array().map_or(0, |a| a.len())
            + ex["nbd"].as_array().map_or(0, |a| a.len());
        Ok(Json(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": s.started.elapsed().as_secs(),
            "pools": entries.len(),
            "volumes": volumes,
            "exports": exports,
            "unavailable_pools": *s.unavailable.read(),
            "rdma": crate::rdma::view(),
            // Where hosts connect: an orchestrator hands these to the nodes it attaches.
            "nvme_listeners": s.nvmf.listeners().iter()
                .map(|(t, a)| json!({"transport": t.as_str(), "address": a.ip().to_string(), "port": a.port()}))
                .collect::<Vec<_>>(),
            "nvme_hosts": crate::rdma::hosts_per_transport(&s.nvmf),
        })))
    })
    .await
}

async fn pools(AxState(s): S) -> R {
    blocking(move || {
        let v: Vec<_> = s.entries().iter().map(|e| s.pool_view(e)).collect();
        to_json(json!({ "pools": v }))
    })
    .await
}

async fn pool(AxState(s): S, P(p): P<String>) -> R {
    blocking(move || to_json(s.pool_view(&*s.entry(&p)?))).await
}

async fn create_pool(
    AxState(s): S,
    Body(req): Body<CreatePool>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let v = blocking(move || to_json(s.create_pool(req)?)).await?;
    Ok((StatusCode::CREATED, v))
}

#[derive(Deserialize)]
struct ImportReq {
    drives: Vec<PathBuf>,
    #[serde(default)]
    force: bool,
}

async fn import(AxState(s): S, Body(r): Body<ImportReq>) -> R {
    blocking(move || {
        let (pools, notes) = s.import(&r.drives, r.force)?;
        to_json(json!({ "pools": pools, "notes": notes }))
    })
    .await
}

#[derive(Deserialize)]
struct DataQuery {
    offset: u64,
    length: Option<u64>,
}

async fn read_data(
    AxState(s): S,
    P(p): P<String>,
    Q(q): Q<DataQuery>,
) -> Result<Response, ApiError> {
    let Some(len) = q.length else {
        return Err(ApiError::bad_request(
            "say how many bytes to read with ?length=N",
        ));
    };
    let bytes = blocking(move || s.read_pool(&p, q.offset, len)).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

async fn write_data(
    AxState(s): S,
    P(p): P<String>,
    Q(q): Q<DataQuery>,
    body: axum::body::Bytes,
) -> R {
    let n = body.len();
    blocking(move || {
        s.write_pool(&p, q.offset, &body)?;
        Ok(Json(json!({ "written": n })))
    })
    .await
}

async fn destroy_pool(AxState(s): S, P(p): P<String>) -> R {
    blocking(move || {
        s.destroy_pool(&p)?;
        Ok(Json(json!({ "destroyed": p })))
    })
    .await
}

#[derive(Deserialize)]
struct PathReq {
    path: PathBuf,
    #[serde(default)]
    force: bool,
}

async fn fail(AxState(s): S, P(p): P<String>, Body(r): Body<PathReq>) -> R {
    blocking(move || Ok(Json(json!({ "message": s.fail(&p, &r.path)? })))).await
}

async fn add_spare(AxState(s): S, P(p): P<String>, Body(r): Body<PathReq>) -> R {
    blocking(move || {
        Ok(Json(
            json!({ "message": s.add_spare(&p, &r.path, r.force)? }),
        ))
    })
    .await
}

#[derive(Deserialize)]
struct ReplaceReq {
    old: PathBuf,
    new: PathBuf,
    #[serde(default)]
    force: bool,
    rate_bytes_per_sec: Option<u64>,
}

async fn replace(AxState(s): S, P(p): P<String>, Body(r): Body<ReplaceReq>) -> R {
    blocking(move || {
        let (m, job) = s.replace(&p, &r.old, &r.new, r.force, r.rate_bytes_per_sec)?;
        Ok(Json(json!({ "message": m, "job": job })))
    })
    .await
}

#[derive(Deserialize, Default)]
struct ScrubReq {
    #[serde(default)]
    repair: bool,
}

async fn bench(
    AxState(s): S,
    Body(r): Body<crate::bench::BenchRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = blocking(move || s.start_bench(r)).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "job": id }))))
}

async fn scrub(
    AxState(s): S,
    P(p): P<String>,
    Body(r): Body<ScrubReq>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = blocking(move || s.scrub(&p, r.repair)).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "job": id }))))
}

#[derive(Deserialize, Default)]
struct RebuildReq {
    rate_bytes_per_sec: Option<u64>,
}

async fn rebuild(AxState(s): S, P(p): P<String>, Body(r): Body<RebuildReq>) -> R {
    blocking(move || Ok(Json(json!({ "job": s.rebuild(&p, r.rate_bytes_per_sec)? })))).await
}

async fn jobs(AxState(s): S) -> R {
    to_json(json!({ "jobs": s.jobs.list() }))
}

async fn job(AxState(s): S, P(id): P<u64>) -> R {
    match s.jobs.get(id) {
        Some(j) => to_json(j),
        None => Err(ApiError::not_found(format!(
            "there is no job {id}; GET /api/v1/jobs lists them"
        ))),
    }
}

async fn volumes(AxState(s): S, P(p): P<String>) -> R {
    blocking(move || to_json(json!({ "volumes": s.entry(&p)?.volumes.list() }))).await
}

#[derive(Deserialize)]
struct CreateVolume {
    name: String,
    size_bytes: u64,
    #[serde(default)]
    force: bool,
    /// Tags of the client's own (an orchestrator's), written with the volume.
    #[serde(default)]
    props: std::collections::BTreeMap<String, String>,
}

async fn create_volume(
    AxState(s): S,
    P(p): P<String>,
    Body(r): Body<CreateVolume>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let v =
        blocking(move || to_json(s.create_volume(&p, &r.name, r.size_bytes, r.force, r.props)?))
            .await?;
    Ok((StatusCode::CREATED, v))
}

async fn volume(AxState(s): S, P((p, v)): P<(String, String)>) -> R {
    blocking(move || to_json(s.volume(&p, &v)?.1)).await
}

#[derive(Deserialize)]
struct GrowVolume {
    size_bytes: u64,
}

async fn grow_volume(
    AxState(s): S,
    P((p, v)): P<(String, String)>,
    Body(r): Body<GrowVolume>,
) -> R {
    blocking(move || to_json(s.grow_volume(&p, &v, r.size_bytes)?)).await
}

async fn delete_volume(AxState(s): S, P((p, v)): P<(String, String)>) -> R {
    blocking(move || {
        s.delete_volume(&p, &v)?;
        Ok(Json(json!({ "deleted": format!("{p}/{v}") })))
    })
    .await
}

async fn exports(AxState(s): S) -> R {
    blocking(move || Ok(Json(s.exports_view()))).await
}

#[derive(Deserialize)]
struct NvmeReq {
    pool: String,
    volume: String,
    nqn: Option<String>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    allow_any_host: bool,
}

async fn add_nvme(
    AxState(s): S,
    Body(r): Body<NvmeReq>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let v = blocking(move || {
        to_json(s.add_nvme_export(&r.pool, &r.volume, r.nqn, r.hosts, r.allow_any_host)?)
    })
    .await?;
    Ok((StatusCode::CREATED, v))
}

async fn remove_nvme(AxState(s): S, P((p, v)): P<(String, String)>) -> R {
    blocking(move || {
        s.remove_nvme_export(&p, &v)?;
        Ok(Json(json!({ "removed": format!("{p}/{v}") })))
    })
    .await
}

/// Adds one host to an NVMe/TCP export (200 with the export, also when it was there).
async fn add_nvme_host(AxState(s): S, P((p, v, h)): P<(String, String, String)>) -> R {
    blocking(move || to_json(s.add_nvme_host(&p, &v, &h)?)).await
}

/// Takes one host off an NVMe/TCP export and drops its connections; the export stays (200
/// with the export, also when the host was not on it).
async fn remove_nvme_host(AxState(s): S, P((p, v, h)): P<(String, String, String)>) -> R {
    blocking(move || to_json(s.remove_nvme_host(&p, &v, &h)?)).await
}

#[derive(Deserialize)]
struct NbdReq {
    pool: String,
    volume: String,
    name: Option<String>,
    #[serde(default)]
    clients: Vec<String>,
    listen: Option<std::net::SocketAddr>,
    socket: Option<PathBuf>,
}

async fn add_nbd(
    AxState(s): S,
    Body(r): Body<NbdReq>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let v = blocking(move || {
        to_json(s.add_nbd_export(&r.pool, &r.volume, r.name, r.clients, r.listen, r.socket)?)
    })
    .await?;
    Ok((StatusCode::CREATED, v))
}

async fn remove_nbd(AxState(s): S, P((p, v)): P<(String, String)>) -> R {
    blocking(move || {
        s.remove_nbd_export(&p, &v)?;
        Ok(Json(json!({ "removed": format!("{p}/{v}") })))
    })
    .await
}

async fn shares(AxState(s): S) -> R {
    blocking(move || to_json(json!({ "shares": s.list_shares() }))).await
}

#[derive(Deserialize)]
struct ShareReq {
    pool: String,
    volume: String,
    size_bytes: u64,
    clients: Vec<String>,
    /// NFS `sync` unless asked otherwise: acknowledged writes survive a crash.
    #[serde(default = "yes")]
    sync: bool,
    #[serde(default = "yes")]
    root_squash: bool,
}

fn yes() -> bool {
    true
}

async fn create_share(
    AxState(s): S,
    Body(r): Body<ShareReq>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let v = blocking(move || {
        to_json(s.create_share(
            &r.pool,
            &r.volume,
            r.size_bytes,
            r.clients,
            r.sync,
            r.root_squash,
        )?)
    })
    .await?;
    Ok((StatusCode::CREATED, v))
}

async fn delete_share(AxState(s): S, P((p, v)): P<(String, String)>) -> R {
    blocking(move || {
        s.delete_share(&p, &v)?;
        Ok(Json(json!({ "deleted": format!("{p}/{v}") })))
    })
    .await
}
