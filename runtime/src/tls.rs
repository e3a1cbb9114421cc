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
//! The admin API (the coordinator's HTTP) is served over TLS 1.3 with the same key, but
//! presented in a self-signed X.509 certificate ([`JobTls::admin_certificate_pem`]), because
//! the tools people point at an admin API (curl, Python's `ssl`, a browser behind a
//! port-forward) cannot take a raw public key. The certificate is a function of the job key
//! alone (rcgen with a fixed name, validity and key-derived serial; Ed25519 signs
//! deterministically), so every process builds the same one. Rust clients accept exactly a
//! certificate whose public key is the job's ([`JobTls::admin_client`]); its ALPN is `http/1.1`.
//!
//! TLS 1.2 is not offered; the cipher suites are rustls's TLS 1.3 suites on `ring`
//! (AES-128-GCM preferred, then AES-256-GCM and ChaCha20-Poly1305). The ALPN protocol `ebbflow/1` is required on
//! both sides, so a stray TLS client of another protocol is refused in the handshake.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::hkdf;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{
    CertificateDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer, UnixTime,
};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// The application protocol both ends name in the handshake.
pub const ALPN: &[u8] = b"ebbflow/1";

/// The admin API's application protocol (axum serves HTTP/1.1 only).
pub const ADMIN_ALPN: &[u8] = b"http/1.1";

/// The admin certificate's subject (its common name): the key, not a name, identifies it.
const ADMIN_SUBJECT: &str = "ebbflow job admin API";

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
    /// For the admin API's server: the same key in an X.509 certificate, ALPN `http/1.1`.
    pub admin_server: Arc<rustls::ServerConfig>,
    /// For the admin API's clients: accepts only a certificate of the job's key.
    pub admin_client: Arc<rustls::ClientConfig>,
    /// The admin API's certificate (DER).
    admin_certificate: CertificateDer<'static>,
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
        let pkcs8 = PrivatePkcs8KeyDer::from(pkcs8);
        let admin_certificate = admin_certificate(&pkcs8)?;
        let signing = rustls::crypto::ring::sign::any_eddsa_type(&pkcs8)?;
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
            x509: false,
        });
        let client = client_config(provider.clone(), verifier.clone(), ALPN)?;
        let mut admin_server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(
                vec![admin_certificate.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(pkcs8.clone_key()),
            )?;
        admin_server.alpn_protocols = vec![ADMIN_ALPN.to_vec()];
        admin_server.send_tls13_tickets = 0;
        let admin_verifier = Arc::new(JobKeyVerifier {
            x509: true,
            ..(*verifier).clone()
        });
        let admin_client = client_config(provider, admin_verifier, ADMIN_ALPN)?;
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
            admin_server: Arc::new(admin_server),
            admin_client: Arc::new(admin_client),
            admin_certificate,
        })
    }

    /// The admin API's certificate in PEM: what `curl --cacert` or Python's
    /// `ssl.SSLContext.load_verify_locations(cadata=...)` trusts (with host-name checks off: the
    /// certificate names no host), or `curl --pinnedpubkey` pins.
    pub fn admin_certificate_pem(&self) -> String {
        let body = self.admin_certificate.as_ref();
        let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
        for line in STANDARD.encode(body).as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
        pem
    }

    /// The admin certificate's public key as curl's `--pinnedpubkey` takes it:
    /// `sha256//` and the base64 of the SHA-256 of its SubjectPublicKeyInfo.
    pub fn admin_public_key_pin(&self) -> String {
        let spki = webpki::EndEntityCert::try_from(&self.admin_certificate)
            .expect("our own certificate parses")
            .subject_public_key_info();
        let digest = ring::digest::digest(&ring::digest::SHA256, spki.as_ref());
        format!("sha256//{}", STANDARD.encode(digest.as_ref()))
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

/// A TLS 1.3-only client configuration that accepts servers through `verifier` and names
/// `alpn`; no resumption (a ticket would only let a later connection skip the key proof).
fn client_config(
    provider: Arc<CryptoProvider>,
    verifier: Arc<JobKeyVerifier>,
    alpn: &[u8],
) -> Result<rustls::ClientConfig, rustls::Error> {
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    client.alpn_protocols = vec![alpn.to_vec()];
    client.resumption = rustls::client::Resumption::disabled();
    Ok(client)
}

/// The admin API's self-signed certificate for the key in `pkcs8`: the same bytes for the same
/// key (fixed subject and validity, a serial rcgen derives from the public key, and Ed25519's
/// deterministic signature).
fn admin_certificate(
    pkcs8: &PrivatePkcs8KeyDer<'_>,
) -> Result<CertificateDer<'static>, rustls::Error> {
    let failed = |error: rcgen::Error| {
        rustls::Error::General(format!("building the admin certificate: {error}"))
    };
    let key = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(pkcs8, &rcgen::PKCS_ED25519)
        .map_err(failed)?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ADMIN_SUBJECT);
    let certificate = params.self_signed(&key).map_err(failed)?;
    Ok(certificate.der().clone())
}

/// Accepts exactly the job's public key, and handshake signatures made with it: as a raw public
/// key (the data plane) or as the key of a lone X.509 certificate (the admin API; nothing else
/// in the certificate is trusted or needed).
#[derive(Debug, Clone)]
struct JobKeyVerifier {
    spki: SubjectPublicKeyInfoDer<'static>,
    algorithms: WebPkiSupportedAlgorithms,
    x509: bool,
}

impl JobKeyVerifier {
    /// The public key `presented` carries, if it is one this verifier takes the form of.
    fn presented_key(
        &self,
        presented: &CertificateDer<'_>,
    ) -> Result<SubjectPublicKeyInfoDer<'static>, rustls::Error> {
        if self.x509 {
            webpki::EndEntityCert::try_from(presented)
                .map(|certificate| certificate.subject_public_key_info())
                .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))
        } else {
            Ok(SubjectPublicKeyInfoDer::from(presented.as_ref().to_vec()))
        }
    }
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
        if intermediates.is_empty()
            && self.presented_key(end_entity)?.as_ref() == self.spki.as_ref()
        {
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
            &self.presented_key(cert)?,
            dss,
            &self.algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        !self.x509
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
