//! The server at a glance, jobs and bench runs.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::Json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{blocking, Body, P};
use super::S;
use crate::error::ApiError;
use crate::model::{BenchRequest, JobList, JobStarted, JobView, Status};
use crate::service;
use crate::state::State;

pub(super) fn routes(r: OpenApiRouter<Arc<State>>) -> OpenApiRouter<Arc<State>> {
    r.routes(routes!(status))
        .routes(routes!(jobs))
        .routes(routes!(job))
        .routes(routes!(bench))
}

/// The server at a glance
#[utoipa::path(get, path = "/api/v1/status", tag = "server",
    responses((status = 200, description = "Counts", body = Status)))]
async fn status(axum::extract::State(s): S) -> Result<Json<Status>, ApiError> {
    blocking(move || service::status(&s)).await.map(Json)
}

/// Rebuilds, scrubs and bench runs, running and finished
#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs",
    responses((status = 200, description = "Jobs", body = JobList)))]
async fn jobs(axum::extract::State(s): S) -> Result<Json<JobList>, ApiError> {
    Ok(Json(service::jobs(&s)?))
}

/// One job
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs",
    params(("id" = u64, Path, description = "The job's number")),
    responses((status = 200, description = "The job", body = JobView)))]
async fn job(axum::extract::State(s): S, P(id): P<u64>) -> Result<Json<JobView>, ApiError> {
    Ok(Json(service::job(&s, id)?))
}

/// Start a bench run: a simulated pool, or the read workloads of a served pool; its job's
/// result holds `results` (as `millrace bench --json`) and `table`
#[utoipa::path(post, path = "/api/v1/bench", tag = "jobs",
    request_body = BenchRequest,
    responses((status = 202, description = "Started", body = JobStarted)))]
async fn bench(
    axum::extract::State(s): S,
    Body(r): Body<BenchRequest>,
) -> Result<(StatusCode, Json<JobStarted>), ApiError> {
    let started = blocking(move || service::bench(&s, r)).await?;
    Ok((StatusCode::ACCEPTED, Json(started)))
}
