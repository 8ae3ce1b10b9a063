//! Extractors whose refusals come back as the API's own 400 sentence (axum's are plain text),
//! and the bridge from async handlers to the blocking service functions.

use axum::extract::{Path, Query, Request};
use axum::Json;

use crate::error::ApiError;

/// Runs blocking pool work off the async threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, millrace_service::ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("the request's worker failed: {e}")))?
        .map_err(ApiError::from)
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
