//! The job's Secret: its data-plane token (also the coordinator's admin secret) and pinned spec.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::{context::Context, plan};

/// The job's data-plane token (also its coordinator's admin secret), if its Secret exists.
pub(super) async fn job_token(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, kube::Error> {
    Ok(job_secret(ctx, namespace, name)
        .await?
        .and_then(|secret| token_of(&secret)))
}

/// The job's Secret (token and pinned spec) from the API server, if it exists.
pub(super) async fn job_secret(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<Secret>, kube::Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    secrets.get_opt(&plan::secret_name(name)).await
}

/// The data-plane token a job's Secret holds, if any.
pub(super) fn token_of(secret: &Secret) -> Option<String> {
    secret_text(secret, plan::TOKEN_KEY)
}

/// The non-empty UTF-8 text under `key` in `secret`, if any.
pub(super) fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
        .filter(|text| !text.is_empty())
}

/// A random 256-bit hex token for the data plane.
pub(super) fn fresh_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
