//! Connection settings for [`crate::SdkEc2`].

use std::fmt;
use std::time::Duration;

/// Where and how to reach EC2.
#[derive(Clone, PartialEq, Eq)]
pub struct Ec2Config {
    /// AWS region (`us-east-1`).
    pub region: String,
    /// Endpoint override (a local moto server). When `None` the SDK also honours the
    /// `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL` environment variables.
    pub endpoint_url: Option<String>,
    /// Fixed credentials (for emulators and tests). `None` uses the SDK's default chain:
    /// environment, profile, web identity (IRSA / EKS Pod Identity), instance metadata.
    pub credentials: Option<StaticCredentials>,
    /// Attempts per call, including the first, with the SDK's standard backoff for
    /// throttling, 5xx and transient transport errors.
    pub max_attempts: u32,
    /// Time limit for a whole call, retries included.
    pub operation_timeout: Duration,
    /// Time limit for establishing a connection.
    pub connect_timeout: Duration,
}

impl Ec2Config {
    /// Settings for `region` with the default credential chain and endpoint.
    pub fn new(region: impl Into<String>) -> Self {
        Self {
            region: region.into(),
            endpoint_url: None,
            credentials: None,
            max_attempts: 3,
            operation_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Settings for a local emulator at `endpoint_url` with dummy credentials.
    pub fn emulator(region: impl Into<String>, endpoint_url: impl Into<String>) -> Self {
        Self {
            endpoint_url: Some(endpoint_url.into()),
            credentials: Some(StaticCredentials::new("testing", "testing")),
            ..Self::new(region)
        }
    }
}

impl fmt::Debug for Ec2Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ec2Config")
            .field("region", &self.region)
            .field("endpoint_url", &self.endpoint_url)
            .field("credentials", &self.credentials)
            .field("max_attempts", &self.max_attempts)
            .field("operation_timeout", &self.operation_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// A fixed access key; its `Debug` output never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    /// Access key ID.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
}

impl StaticCredentials {
    /// Builds credentials from a key pair.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        Self {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
        }
    }
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"** redacted **")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        let config = Ec2Config {
            credentials: Some(StaticCredentials::new(
                "AKIDEXAMPLE",
                "wJalrXUtnFEMI/K7MDENG",
            )),
            ..Ec2Config::new("us-east-1")
        };
        let shown = format!("{config:?}");
        assert!(shown.contains("AKIDEXAMPLE"));
        assert!(!shown.contains("wJalrXUtnFEMI"), "{shown}");
    }
}
