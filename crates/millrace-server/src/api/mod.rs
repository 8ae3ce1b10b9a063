//! The HTTP API: JSON under /api/v1, /metrics, and the dashboard at /. Refusals are
//! `{"error": "sentence"}` with 400 (bad request), 401 (token), 404 (no such thing) or 409
//! (conflicts with the current state); a refused request changes nothing. Each handler is a
//! thin wrapper over its function in `service`; the OpenAPI document is generated from the
//! handlers' annotations and the model's types (utoipa), and the routes come from the same
//! annotations, so a routed call cannot be missing from the document.

mod exports;
mod extract;
mod guard;
mod jobs;
mod pools;
mod volumes;

use std::sync::Arc;

use axum::extract::{Request, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{OpenApi as Doc, RefOr};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::error::{ApiError, ErrorBody};
use crate::state::State;

type S = AxState<Arc<State>>;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Millrace API",
        description = "Pools, members, volumes, exports, rebuilds and scrubs of a Millrace data server. Listening beyond loopback, every call needs 'Authorization: Bearer TOKEN'."
    ),
    components(schemas(ErrorBody)),
    security(("bearer" = []))
)]
struct ApiDoc;

/// Every call can be refused the same ways: the document lists them once here rather than on
/// each handler, with the bearer scheme.
struct Refusals;

impl utoipa::Modify for Refusals {
    fn modify(&self, doc: &mut Doc) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        let refused = utoipa::openapi::ResponseBuilder::new()
            .description("Refused; the body says why")
            .content(
                "application/json",
                utoipa::openapi::ContentBuilder::new()
                    .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build();
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                for code in ["400", "401", "404", "409"] {
                    op.responses
                        .responses
                        .entry(code.to_string())
                        .or_insert_with(|| RefOr::T(refused.clone()));
                }
            }
        }
    }
}

/// The API's routes and its OpenAPI document, made together from the handlers' annotations.
fn routes() -> (Router<Arc<State>>, Doc) {
    let api = OpenApiRouter::with_openapi(ApiDoc::openapi());
    let api = jobs::routes(api);
    let api = pools::routes(api);
    let api = volumes::routes(api);
    let api = exports::routes(api);
    let (router, mut doc) = api.split_for_parts();
    // After the routes: a modifier of ApiDoc would run before they add their paths.
    utoipa::Modify::modify(&Refusals, &mut doc);
    (router, doc)
}

pub use guard::HostGuard;

pub fn router(state: Arc<State>, token: Option<String>, hosts: HostGuard) -> Router {
    let (api, doc) = routes();
    let doc = Arc::new(doc);
    let api = api
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { Json(doc.as_ref().clone()) }
            }),
        )
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
        .layer(middleware::from_fn_with_state(
            Arc::new(hosts),
            guard::check,
        ))
        .with_state(state)
}

/// The credentials of an `Authorization: Bearer TOKEN` header. The scheme name is
/// case-insensitive (RFC 7235 2.1), so `bearer` and `BEARER` are the same scheme.
fn bearer_credentials(v: &str) -> Option<&str> {
    let (scheme, rest) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
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
        .and_then(bearer_credentials);
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => next.run(req).await,
        Some(_) => (
            StatusCode::UNAUTHORIZED,
            Json(ErrorBody::new("the bearer token is wrong; use the one in the server's --token-file")),
        )
            .into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(ErrorBody::new(
                "this server needs a token: send the header 'Authorization: Bearer TOKEN' (the CLI reads MILLRACE_TOKEN)",
            )),
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
    Html(include_str!("../index.html"))
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
