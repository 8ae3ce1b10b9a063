//! The service layer's refusals as the API answers them: `{"error": sentence}` with the status.
//! A type of this crate (axum's `IntoResponse` cannot be given to the service crate's type
//! here), made from the service's `ApiError` by `?`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

pub use millrace_service::ErrorBody;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(m: impl Into<String>) -> Self {
        millrace_service::ApiError::bad_request(m).into()
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        millrace_service::ApiError::not_found(m).into()
    }
    pub fn internal(m: impl Into<String>) -> Self {
        millrace_service::ApiError::internal(m).into()
    }
}

impl From<millrace_service::ApiError> for ApiError {
    fn from(e: millrace_service::ApiError) -> Self {
        // The same `http` crate's StatusCode on both sides: axum re-exports it.
        Self {
            status: e.status,
            message: e.message,
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
        (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response()
    }
}

impl std::error::Error for ApiError {}
