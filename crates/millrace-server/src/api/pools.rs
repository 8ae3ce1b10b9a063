//! Pools: their life, their members, their raw bytes, scrubs and rebuilds.

use std::sync::Arc;

use axum::extract::State as AxState;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{blocking, Body, P, Q};
use super::S;
use crate::error::ApiError;
use crate::model::*;
use crate::service;
use crate::state::State;

type R<T> = Result<Json<T>, ApiError>;
type Created<T> = Result<(StatusCode, Json<T>), ApiError>;

pub(super) fn routes(r: OpenApiRouter<Arc<State>>) -> OpenApiRouter<Arc<State>> {
    // Raw transfers may be as large as MAX_RAW_IO; every other body stays under axum's default.
    let data = OpenApiRouter::new()
        .routes(routes!(read_data, write_data))
        .layer(axum::extract::DefaultBodyLimit::max(
            crate::model::MAX_RAW_IO as usize,
        ));
    r.routes(routes!(pools, create_pool))
        .routes(routes!(import))
        .routes(routes!(pool, destroy_pool))
        .merge(data)
        .routes(routes!(fail))
        .routes(routes!(add_spare))
        .routes(routes!(replace))
        .routes(routes!(scrub))
        .routes(routes!(rebuild))
}

/// Every pool served
#[utoipa::path(get, path = "/api/v1/pools", tag = "pools",
    responses((status = 200, description = "Pools", body = PoolList)))]
async fn pools(AxState(s): S) -> R<PoolList> {
    blocking(move || service::pools(&s)).await.map(Json)
}

/// Create a pool
#[utoipa::path(post, path = "/api/v1/pools", tag = "pools", request_body = CreatePool,
    responses((status = 201, description = "The new pool", body = PoolView)))]
async fn create_pool(AxState(s): S, Body(req): Body<CreatePool>) -> Created<PoolView> {
    let v = blocking(move || service::create_pool(&s, req)).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// Assemble and serve the pools found on these drives
#[utoipa::path(post, path = "/api/v1/pools/import", tag = "pools", request_body = ImportRequest,
    responses((status = 200, description = "The pools found", body = ImportResponse)))]
async fn import(AxState(s): S, Body(r): Body<ImportRequest>) -> R<ImportResponse> {
    blocking(move || service::import(&s, r)).await.map(Json)
}

/// One pool: geometry, state, members, volumes, counters
#[utoipa::path(get, path = "/api/v1/pools/{pool}", tag = "pools", params(("pool" = String, Path)),
    responses((status = 200, description = "The pool", body = PoolView)))]
async fn pool(AxState(s): S, P(p): P<String>) -> R<PoolView> {
    blocking(move || service::pool(&s, &p)).await.map(Json)
}

/// Destroy a pool (refused while it exports volumes)
#[utoipa::path(delete, path = "/api/v1/pools/{pool}", tag = "pools", params(("pool" = String, Path)),
    responses((status = 200, description = "Done", body = Destroyed)))]
async fn destroy_pool(AxState(s): S, P(p): P<String>) -> R<Destroyed> {
    blocking(move || service::destroy_pool(&s, &p))
        .await
        .map(Json)
}

/// Read raw bytes of a pool (at most 64 MiB a call)
#[utoipa::path(get, path = "/api/v1/pools/{pool}/data", tag = "pools",
    params(("pool" = String, Path), DataQuery),
    responses((status = 200, description = "The bytes", body = RawBytes,
        content_type = "application/octet-stream")))]
async fn read_data(
    AxState(s): S,
    P(p): P<String>,
    Q(q): Q<DataQuery>,
) -> Result<Response, ApiError> {
    let bytes = blocking(move || service::read_data(&s, &p, q)).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// Write raw bytes to a pool (at most 64 MiB a call); durable when answered
#[utoipa::path(put, path = "/api/v1/pools/{pool}/data", tag = "pools",
    params(("pool" = String, Path), DataQuery),
    request_body(content = RawBytes, content_type = "application/octet-stream"),
    responses((status = 200, description = "Written and flushed", body = Written)))]
async fn write_data(
    AxState(s): S,
    P(p): P<String>,
    Q(q): Q<DataQuery>,
    body: axum::body::Bytes,
) -> R<Written> {
    blocking(move || service::write_data(&s, &p, q.offset, &body))
        .await
        .map(Json)
}

/// Take a member out of service
#[utoipa::path(post, path = "/api/v1/pools/{pool}/fail", tag = "members",
    params(("pool" = String, Path)), request_body = PathRequest,
    responses((status = 200, description = "Done", body = Message)))]
async fn fail(AxState(s): S, P(p): P<String>, Body(r): Body<PathRequest>) -> R<Message> {
    blocking(move || service::fail(&s, &p, r)).await.map(Json)
}

/// Add a hot spare
#[utoipa::path(post, path = "/api/v1/pools/{pool}/spares", tag = "members",
    params(("pool" = String, Path)), request_body = PathRequest,
    responses((status = 200, description = "Done", body = Message)))]
async fn add_spare(AxState(s): S, P(p): P<String>, Body(r): Body<PathRequest>) -> R<Message> {
    blocking(move || service::add_spare(&s, &p, r))
        .await
        .map(Json)
}

/// Replace a member and rebuild onto the new drive
#[utoipa::path(post, path = "/api/v1/pools/{pool}/replace", tag = "members",
    params(("pool" = String, Path)), request_body = ReplaceRequest,
    responses((status = 200, description = "Started", body = ReplaceResponse)))]
async fn replace(
    AxState(s): S,
    P(p): P<String>,
    Body(r): Body<ReplaceRequest>,
) -> R<ReplaceResponse> {
    blocking(move || service::replace(&s, &p, r))
        .await
        .map(Json)
}

/// Start a scrub
#[utoipa::path(post, path = "/api/v1/pools/{pool}/scrub", tag = "jobs",
    params(("pool" = String, Path)), request_body = ScrubRequest,
    responses((status = 202, description = "Started", body = JobStarted)))]
async fn scrub(AxState(s): S, P(p): P<String>, Body(r): Body<ScrubRequest>) -> Created<JobStarted> {
    let started = blocking(move || service::scrub(&s, &p, r)).await?;
    Ok((StatusCode::ACCEPTED, Json(started)))
}

/// Start or follow the rebuild of members waiting for one
#[utoipa::path(post, path = "/api/v1/pools/{pool}/rebuild", tag = "jobs",
    params(("pool" = String, Path)), request_body = RebuildRequest,
    responses((status = 200, description = "The job, or null when nothing waits", body = RebuildResponse)))]
async fn rebuild(
    AxState(s): S,
    P(p): P<String>,
    Body(r): Body<RebuildRequest>,
) -> R<RebuildResponse> {
    blocking(move || service::rebuild(&s, &p, r))
        .await
        .map(Json)
}
