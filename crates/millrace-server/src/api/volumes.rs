//! Volumes: named, stripe-aligned ranges of a pool.

use std::sync::Arc;

use axum::extract::State as AxState;
use axum::http::StatusCode;
use axum::Json;
use millrace_volume::VolumeInfo;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{blocking, Body, P};
use super::S;
use crate::error::ApiError;
use crate::model::{CreateVolume, Deleted, GrowVolume, VolumeList};
use crate::service;
use crate::state::State;

type R<T> = Result<Json<T>, ApiError>;

pub(super) fn routes(r: OpenApiRouter<Arc<State>>) -> OpenApiRouter<Arc<State>> {
    r.routes(routes!(volumes, create_volume))
        .routes(routes!(volume, grow_volume, delete_volume))
}

/// A pool's volumes
#[utoipa::path(get, path = "/api/v1/pools/{pool}/volumes", tag = "volumes",
    params(("pool" = String, Path)),
    responses((status = 200, description = "Volumes", body = VolumeList)))]
async fn volumes(AxState(s): S, P(p): P<String>) -> R<VolumeList> {
    blocking(move || service::volumes(&s, &p)).await.map(Json)
}

/// Create a volume (size rounded up to the full stripe); `props` are tags of the client's own,
/// written with it
#[utoipa::path(post, path = "/api/v1/pools/{pool}/volumes", tag = "volumes",
    params(("pool" = String, Path)), request_body = CreateVolume,
    responses((status = 201, description = "The volume", body = VolumeInfo)))]
async fn create_volume(
    AxState(s): S,
    P(p): P<String>,
    Body(r): Body<CreateVolume>,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    let v = blocking(move || service::create_volume(&s, &p, r)).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// One volume
#[utoipa::path(get, path = "/api/v1/pools/{pool}/volumes/{vol}", tag = "volumes",
    params(("pool" = String, Path), ("vol" = String, Path)),
    responses((status = 200, description = "The volume", body = VolumeInfo)))]
async fn volume(AxState(s): S, P((p, v)): P<(String, String)>) -> R<VolumeInfo> {
    blocking(move || service::volume(&s, &p, &v))
        .await
        .map(Json)
}

/// Grow a volume in place
#[utoipa::path(patch, path = "/api/v1/pools/{pool}/volumes/{vol}", tag = "volumes",
    params(("pool" = String, Path), ("vol" = String, Path)), request_body = GrowVolume,
    responses((status = 200, description = "The volume", body = VolumeInfo)))]
async fn grow_volume(
    AxState(s): S,
    P((p, v)): P<(String, String)>,
    Body(r): Body<GrowVolume>,
) -> R<VolumeInfo> {
    blocking(move || service::grow_volume(&s, &p, &v, r))
        .await
        .map(Json)
}

/// Delete a volume (refused while exported)
#[utoipa::path(delete, path = "/api/v1/pools/{pool}/volumes/{vol}", tag = "volumes",
    params(("pool" = String, Path), ("vol" = String, Path)),
    responses((status = 200, description = "Done", body = Deleted)))]
async fn delete_volume(AxState(s): S, P((p, v)): P<(String, String)>) -> R<Deleted> {
    blocking(move || service::delete_volume(&s, &p, &v))
        .await
        .map(Json)
}
