//! Exports (NVMe/TCP, NBD) and NFS shares of volumes.

use std::sync::Arc;

use axum::extract::State as AxState;
use axum::http::StatusCode;
use axum::Json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{blocking, Body, P};
use super::S;
use crate::error::ApiError;
use crate::model::*;
use crate::service;
use crate::state::State;

type R<T> = Result<Json<T>, ApiError>;
type Created<T> = Result<(StatusCode, Json<T>), ApiError>;

pub(super) fn routes(r: OpenApiRouter<Arc<State>>) -> OpenApiRouter<Arc<State>> {
    r.routes(routes!(exports))
        .routes(routes!(add_nvme))
        .routes(routes!(remove_nvme))
        .routes(routes!(add_nvme_host, remove_nvme_host))
        .routes(routes!(set_nvme_ana))
        .routes(routes!(set_nvme_host_keys))
        .routes(routes!(clear_nvme_reservation))
        .routes(routes!(add_nbd))
        .routes(routes!(remove_nbd))
        .routes(routes!(shares, create_share))
        .routes(routes!(delete_share))
}

/// Every export and who is connected
#[utoipa::path(get, path = "/api/v1/exports", tag = "exports",
    responses((status = 200, description = "Exports", body = ExportsView)))]
async fn exports(AxState(s): S) -> R<ExportsView> {
    blocking(move || service::exports(&s)).await.map(Json)
}

/// Export a volume over NVMe/TCP (closed unless hosts are named or allow_any_host)
#[utoipa::path(post, path = "/api/v1/exports/nvme", tag = "exports",
    request_body = NvmeExportRequest,
    responses((status = 201, description = "The export", body = NvmeExportConfig)))]
async fn add_nvme(AxState(s): S, Body(r): Body<NvmeExportRequest>) -> Created<NvmeExportConfig> {
    let v = blocking(move || service::add_nvme(&s, r)).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// Stop exporting a volume over NVMe/TCP
#[utoipa::path(delete, path = "/api/v1/exports/nvme/{pool}/{vol}", tag = "exports",
    params(("pool" = String, Path), ("vol" = String, Path)),
    responses((status = 200, description = "Done", body = Removed)))]
async fn remove_nvme(AxState(s): S, P((p, v)): P<(String, String)>) -> R<Removed> {
    blocking(move || service::remove_nvme(&s, &p, &v))
        .await
        .map(Json)
}

/// Let one more host (its NQN, percent-encoded) connect to a volume's NVMe/TCP export; a host
/// already there changes nothing
#[utoipa::path(put, path = "/api/v1/exports/nvme/{pool}/{vol}/hosts/{host}", tag = "exports",
    params(("pool" = String, Path), ("vol" = String, Path), ("host" = String, Path)),
    responses((status = 200, description = "The export", body = NvmeExportConfig)))]
async fn add_nvme_host(
    AxState(s): S,
    P((p, v, h)): P<(String, String, String)>,
) -> R<NvmeExportConfig> {
    blocking(move || service::add_nvme_host(&s, &p, &v, &h))
        .await
        .map(Json)
}

/// Take one host off a volume's NVMe/TCP export and disconnect it; the export stays (a host
/// not on it changes nothing)
#[utoipa::path(delete, path = "/api/v1/exports/nvme/{pool}/{vol}/hosts/{host}", tag = "exports",
    params(("pool" = String, Path), ("vol" = String, Path), ("host" = String, Path)),
    responses((status = 200, description = "The export", body = NvmeExportConfig)))]
async fn remove_nvme_host(
    AxState(s): S,
    P((p, v, h)): P<(String, String, String)>,
) -> R<NvmeExportConfig> {
    blocking(move || service::remove_nvme_host(&s, &p, &v, &h))
        .await
        .map(Json)
}

/// Set the ANA state of a volume's NVMe export on one path (listener): hosts connected through
/// it are told, and their multipath sends I/O to the optimized paths (none to an inaccessible one)
#[utoipa::path(put, path = "/api/v1/exports/nvme/{pool}/{vol}/ana", tag = "exports",
    params(("pool" = String, Path), ("vol" = String, Path)),
    request_body = AnaRequest,
    responses((status = 200, description = "The export with its paths", body = NvmeExportView)))]
async fn set_nvme_ana(
    AxState(s): S,
    P((p, v)): P<(String, String)>,
    Body(r): Body<AnaRequest>,
) -> R<NvmeExportView> {
    blocking(move || service::set_nvme_ana(&s, &p, &v, r))
        .await
        .map(Json)
}

/// Set or rotate the DH-HMAC-CHAP secrets a host (its NQN, percent-encoded) authenticates with
/// on a volume's NVMe export, and/or its TLS PSK (`tls_psk`, for listeners that require TLS);
/// the host's next authentication or TLS handshake uses them. Never returned
#[utoipa::path(put, path = "/api/v1/exports/nvme/{pool}/{vol}/hosts/{host}/dhchap", tag = "exports",
    params(("pool" = String, Path), ("vol" = String, Path), ("host" = String, Path)),
    request_body = NvmeHostKeysRequest,
    responses((status = 200, description = "The export", body = NvmeExportView)))]
async fn set_nvme_host_keys(
    AxState(s): S,
    P((p, v, h)): P<(String, String, String)>,
    Body(r): Body<NvmeHostKeysRequest>,
) -> R<NvmeExportView> {
    blocking(move || service::set_nvme_host_keys(&s, &p, &v, &h, r))
        .await
        .map(Json)
}

/// Clear a volume's NVMe reservation and every registration (an operator fencing a cluster
/// that is gone): the registered hosts are told their reservation was preempted
#[utoipa::path(delete, path = "/api/v1/exports/nvme/{pool}/{vol}/reservation", tag = "exports",
    params(("pool" = String, Path), ("vol" = String, Path)),
    responses((status = 200, description = "The export, its reservation cleared", body = NvmeExportView)))]
async fn clear_nvme_reservation(
    AxState(s): S,
    P((p, v)): P<(String, String)>,
) -> R<NvmeExportView> {
    blocking(move || service::clear_nvme_reservation(&s, &p, &v))
        .await
        .map(Json)
}

/// Export a volume over NBD (Unix socket; TCP only for listed clients)
#[utoipa::path(post, path = "/api/v1/exports/nbd", tag = "exports",
    request_body = NbdExportRequest,
    responses((status = 201, description = "The export", body = NbdExportConfig)))]
async fn add_nbd(AxState(s): S, Body(r): Body<NbdExportRequest>) -> Created<NbdExportConfig> {
    let v = blocking(move || service::add_nbd(&s, r)).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// Stop exporting a volume over NBD
#[utoipa::path(delete, path = "/api/v1/exports/nbd/{pool}/{vol}", tag = "exports",
    params(("pool" = String, Path), ("vol" = String, Path)),
    responses((status = 200, description = "Done", body = Removed)))]
async fn remove_nbd(AxState(s): S, P((p, v)): P<(String, String)>) -> R<Removed> {
    blocking(move || service::remove_nbd(&s, &p, &v))
        .await
        .map(Json)
}

/// Every NFS share
#[utoipa::path(get, path = "/api/v1/shares", tag = "shares",
    responses((status = 200, description = "Shares", body = ShareList)))]
async fn shares(AxState(s): S) -> R<ShareList> {
    blocking(move || service::shares(&s)).await.map(Json)
}

/// Create a share: a volume, XFS aligned to the pool's stripes, mounted and exported by the
/// kernel NFS server (v3, v4.2) to the listed clients
#[utoipa::path(post, path = "/api/v1/shares", tag = "shares", request_body = ShareRequest,
    responses((status = 201, description = "The share", body = ShareView)))]
async fn create_share(AxState(s): S, Body(r): Body<ShareRequest>) -> Created<ShareView> {
    let v = blocking(move || service::create_share(&s, r)).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// Delete a share: unexport, unmount, detach, and delete its volume
#[utoipa::path(delete, path = "/api/v1/shares/{pool}/{vol}", tag = "shares",
    params(("pool" = String, Path), ("vol" = String, Path)),
    responses((status = 200, description = "Done", body = Deleted)))]
async fn delete_share(AxState(s): S, P((p, v)): P<(String, String)>) -> R<Deleted> {
    blocking(move || service::delete_share(&s, &p, &v))
        .await
        .map(Json)
}
