//! The operator's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (the process
//! serves) and `/readyz` (this replica leads and its controller runs).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{
    Router, extract::State, http::StatusCode, http::header, response::IntoResponse, routing::get,
};
use prometheus::{Encoder, Registry, TextEncoder};

/// Shared state of the endpoints.
#[derive(Clone)]
pub struct HttpState {
    /// Registry `/metrics` encodes.
    pub registry: Registry,
    /// Set once the controller runs.
    pub ready: Arc<AtomicBool>,
}

/// The router serving the three endpoints.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&state.registry.gather(), &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
            body,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain".to_owned())],
            error.to_string().into_bytes(),
        ),
    }
}

async fn readyz(State(state): State<HttpState>) -> (StatusCode, &'static str) {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for leadership or start-up",
        )
    }
}

/// Serves the endpoints on an already-bound listener until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[tokio::test]
    async fn endpoints_answer_over_tcp() {
        let registry = Registry::new();
        let metrics = Metrics::register(&registry).unwrap();
        metrics.reconciliations.inc();
        let ready = Arc::new(AtomicBool::new(false));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            HttpState {
                registry,
                ready: ready.clone(),
            },
            async move {
                let _ = stopped.await;
            },
        ));
        let client = ebbflow_runtime::admin::client(None).build().unwrap();
        let get = |path: &str| client.get(format!("http://{address}{path}")).send();

        assert_eq!(get("/healthz").await.unwrap().status(), 200);
        assert_eq!(get("/readyz").await.unwrap().status(), 503);
        ready.store(true, Ordering::Relaxed);
        assert_eq!(get("/readyz").await.unwrap().status(), 200);
        let text = get("/metrics").await.unwrap().text().await.unwrap();
        assert!(
            text.contains("ebbflow_operator_reconciliations_total 1"),
            "{text}"
        );

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
