//! TLS 1.3 on the data plane, keyed by the job key alone.
//!
//! Every process of a job holds the job key and nothing else secret. From it each derives the
//! same Ed25519 key pair (HKDF-SHA256 over the key, a fixed label as salt), and the servers
//! present its public key as an RFC 7250 raw public key instead of a certificate. A client
//! accepts a server only if it presents exactly that key and proves, in the handshake's
//! signature, that it holds the private half: a server that is not the job's (another job's, a
//! man in the middle, a peer that only recorded traffic) cannot finish the handshake. The
//! client in turn proves the key to the server by the challenge-response of
//! [`crate::handshake`], which now runs inside the encrypted channel.
//!
//! Why not a per-job CA with per-pod certificates: it needs the same secret distribution (the
//! CA's key or each pod's key in the job's Secret) plus issuing and rotation, and buys nothing
//! here, because every pod of a job is equally trusted with the whole model. Why not a TLS 1.3
//! pre-shared key: rustls offers no external PSKs. The derived key is exactly as strong as
//! the job key, which already guards the job, and an `ebbflow run` on one machine and a job in
//! a cluster use the same code.
//!
//! TLS 1.2 is not offered; the cipher suites are rustls's TLS 1.3 suites on `ring`
//! (AES-128-GCM preferred, then AES-256-GCM and ChaCha20-Poly1305). The ALPN protocol `ebbflow/1` is required on
//! both sides, so a stray TLS client of another protocol is refused in the handshake.

use std::sync::Arc;

use ring::hkdf;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{
    CertificateDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer, UnixTime,
};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// The application protocol both ends name in the handshake.
pub const ALPN: &[u8] = b"ebbflow/1";

/// The first byte of every TLS record a client opens a connection with (a handshake record):
/// how a server tells a TLS client from a plaintext one before reading a frame.
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a job's data-plane connections are protected.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum TransportSecurity {
    /// TLS 1.3 keyed by the job key (the default).
    #[default]
    Tls,
    /// Plain TCP: the handshake still proves the key without sending it, but parameters and
    /// deltas cross the network in clear.
    None,
}

impl TransportSecurity {
    /// Its name on command lines, in the environment and in a job's spec.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportSecurity::Tls => "tls",
            TransportSecurity::None => "none",
        }
    }
}

impl std::fmt::Display for TransportSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TransportSecurity {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tls" => Ok(TransportSecurity::Tls),
            "none" => Ok(TransportSecurity::None),
            other => Err(format!(
                "unknown transport security {other:?}: expected \"tls\" or \"none\""
            )),
        }
    }
}

/// The TLS configurations of one job: servers present the job's key, clients accept only it.
#[derive(Clone)]
pub struct JobTls {
    /// For the data-plane servers (and the coordinator's admin API).
    pub server: Arc<rustls::ServerConfig>,
    /// For the clients of those servers.
    pub client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for JobTls {
    // Configurations hold the private key: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobTls { .. }")
    }
}

/// PKCS#8 v1 (RFC 8410) of an Ed25519 private key: this prefix, then the 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The salt of the identity's derivation; a new version of the scheme changes it.
const IDENTITY_SALT: &[u8] = b"ebbflow/1 tls identity";

/// The Ed25519 seed derived from the job key.
fn identity_seed(key: &[u8]) -> [u8; 32] {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, IDENTITY_SALT).extract(key);
    let mut seed = [0u8; 32];
    prk.expand(&[b"ed25519 seed"], hkdf::HKDF_SHA256)
        .and_then(|okm| okm.fill(&mut seed))
        .expect("32 bytes is HKDF-SHA256's own output length");
    seed
}

/// ring's TLS 1.3 suites, AES-128-GCM first: ring orders AES-256-GCM first, whose 14 rounds
/// (against 10) cost the data plane throughput that 128-bit keys, TLS 1.3's mandatory suite,
/// do not need (`scripts/bench-tls.sh`).
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    })
}

impl JobTls {
    /// The configurations for the job whose key is `key`.
    ///
    /// # Panics
    /// Never for any key: the key pair is derived, not parsed, and rustls's `ring` provider
    /// offers TLS 1.3 and Ed25519 (a failure here is a bug, caught by this module's tests).
    pub fn new(key: &[u8]) -> Self {
        Self::build(key).expect("a derived Ed25519 key and TLS 1.3 on ring always configure")
    }

    fn build(key: &[u8]) -> Result<Self, rustls::Error> {
        let seed = identity_seed(key);
        let mut pkcs8 = Vec::with_capacity(48);
        pkcs8.extend_from_slice(&ED25519_PKCS8_PREFIX);
        pkcs8.extend_from_slice(&seed);
        let signing = rustls::crypto::ring::sign::any_eddsa_type(&PrivatePkcs8KeyDer::from(pkcs8))?;
        let spki = signing
            .public_key()
            .ok_or(rustls::Error::General(
                "the Ed25519 key has no public key".into(),
            ))?
            .into_owned();
        let provider = provider();
        let certified = Arc::new(rustls::sign::CertifiedKey::new(
            vec![CertificateDer::from(spki.as_ref().to_vec())],
            signing,
        ));
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(
                rustls::server::AlwaysResolvesServerRawPublicKeys::new(certified),
            ));
        server.alpn_protocols = vec![ALPN.to_vec()];
        // Frames are large; a ticket would only let a later connection skip the key proof.
        server.send_tls13_tickets = 0;
        let verifier = Arc::new(JobKeyVerifier {
            spki,
            algorithms: provider.signature_verification_algorithms,
        });
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        client.alpn_protocols = vec![ALPN.to_vec()];
        client.resumption = rustls::client::Resumption::disabled();
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// The configurations for `security` (none for [`TransportSecurity::None`]).
    pub fn for_security(security: TransportSecurity, key: &[u8]) -> Option<Arc<Self>> {
        match security {
            TransportSecurity::Tls => Some(Arc::new(Self::new(key))),
            TransportSecurity::None => None,
        }
    }

    /// The name a client gives the server: the key, not a name, identifies it, so it is fixed.
    pub fn server_name() -> ServerName<'static> {
        ServerName::try_from("ebbflow.invalid").expect("a valid DNS name")
    }
}

/// Accepts exactly the job's raw public key, and handshake signatures made with it.
#[derive(Debug)]
struct JobKeyVerifier {
    spki: SubjectPublicKeyInfoDer<'static>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for JobKeyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // Constant time is not needed: the public key is public.
        if intermediates.is_empty() && end_entity.as_ref() == self.spki.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(cert.as_ref()),
            dss,
            &self.algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_the_keys_own_and_differs_between_jobs() {
        assert_eq!(identity_seed(b"job a"), identity_seed(b"job a"));
        assert_ne!(identity_seed(b"job a"), identity_seed(b"job b"));
        let seed = identity_seed(b"job a");
        assert!(!seed.windows(5).any(|w| w == b"job a"));
        assert!(format!("{:?}", JobTls::new(b"job a")).contains(".."));
        assert!(JobTls::for_security(TransportSecurity::None, b"job a").is_none());
    }

    #[test]
    fn transport_security_parses_its_two_names_only() {
        assert_eq!("tls".parse(), Ok(TransportSecurity::Tls));
        assert_eq!("none".parse(), Ok(TransportSecurity::None));
        let error = "TLS1.2".parse::<TransportSecurity>().unwrap_err();
        assert!(
            error.contains("\"TLS1.2\"") && error.contains("\"none\""),
            "{error}"
        );
        assert_eq!(TransportSecurity::default().to_string(), "tls");
    }
}
