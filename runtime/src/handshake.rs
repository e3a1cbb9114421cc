//! The data plane's handshake: both ends prove they hold the job key, and neither sends it.
//!
//! ```text
//! client → server   Hello     { node, client nonce }
//! server → client   Challenge { server nonce, HMAC-SHA256(key, "ebbflow/1 server" ‖ node ‖ client nonce ‖ server nonce) }
//! client → server   Proof     { HMAC-SHA256(key, "ebbflow/1 client" ‖ node ‖ client nonce ‖ server nonce) }
//! server → client   Welcome
//! ```
//!
//! Nonces are 32 bytes from the operating system's generator. What crosses the wire is two
//! nonces and two MACs: a passive reader learns nothing that proves anything on another
//! connection. The server's nonce is fresh per connection, so a recorded `Proof` replayed on a
//! new one answers the wrong challenge and is refused; the client's nonce makes the server's
//! proof fresh too, so a client never sends rows to a peer that only replays a server's
//! answers. Both MACs bind the connecting node's id and differ by role, so one side's proof is
//! never the other's. Verification is constant-time (`ring::hmac::verify`).
//!
//! The client sends its requests right after its proof, without waiting for the welcome, so the
//! handshake costs one round trip more than the key in clear did (and connections opened
//! together take theirs at once).

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes of each side's nonce.
pub const NONCE_BYTES: usize = 32;
/// Bytes of each side's proof (an HMAC-SHA256 tag).
pub const PROOF_BYTES: usize = 32;

const SERVER_LABEL: &[u8] = b"ebbflow/1 server";
const CLIENT_LABEL: &[u8] = b"ebbflow/1 client";

/// A fresh nonce.
///
/// # Panics
/// If the operating system's random generator fails (no `getrandom`), which nothing here can
/// recover from.
pub fn nonce() -> [u8; NONCE_BYTES] {
    let mut out = [0u8; NONCE_BYTES];
    SystemRandom::new()
        .fill(&mut out)
        .expect("the operating system's random generator failed");
    out
}

fn message(label: &[u8], node: u32, client: &[u8], server: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(label.len() + 4 + client.len() + server.len());
    out.extend_from_slice(label);
    out.extend_from_slice(&node.to_le_bytes());
    out.extend_from_slice(client);
    out.extend_from_slice(server);
    out
}

fn sign(key: &[u8], label: &[u8], node: u32, client: &[u8], server: &[u8]) -> [u8; PROOF_BYTES] {
    let tag = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        &message(label, node, client, server),
    );
    let mut out = [0u8; PROOF_BYTES];
    out.copy_from_slice(tag.as_ref());
    out
}

fn verify(key: &[u8], label: &[u8], node: u32, client: &[u8], server: &[u8], proof: &[u8]) -> bool {
    hmac::verify(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        &message(label, node, client, server),
        proof,
    )
    .is_ok()
}

/// The server's proof for `node`'s connection with these nonces.
pub fn server_proof(key: &[u8], node: u32, client: &[u8], server: &[u8]) -> [u8; PROOF_BYTES] {
    sign(key, SERVER_LABEL, node, client, server)
}

/// The client's proof for `node`'s connection with these nonces.
pub fn client_proof(key: &[u8], node: u32, client: &[u8], server: &[u8]) -> [u8; PROOF_BYTES] {
    sign(key, CLIENT_LABEL, node, client, server)
}

/// Whether `proof` is the server's for this connection (constant-time).
pub fn verify_server(key: &[u8], node: u32, client: &[u8], server: &[u8], proof: &[u8]) -> bool {
    verify(key, SERVER_LABEL, node, client, server, proof)
}

/// Whether `proof` is the client's for this connection (constant-time).
pub fn verify_client(key: &[u8], node: u32, client: &[u8], server: &[u8], proof: &[u8]) -> bool {
    verify(key, CLIENT_LABEL, node, client, server, proof)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_proof_holds_for_its_key_role_node_and_nonces_only() {
        let (client, server) = (nonce(), nonce());
        assert_ne!(client, server, "fresh");
        let key = b"job key";
        let proof = client_proof(key, 3, &client, &server);
        assert!(verify_client(key, 3, &client, &server, &proof));
        // another key, node, nonce or role
        assert!(!verify_client(b"other key", 3, &client, &server, &proof));
        assert!(!verify_client(key, 4, &client, &server, &proof));
        assert!(!verify_client(key, 3, &client, &nonce(), &proof));
        assert!(!verify_client(key, 3, &nonce(), &server, &proof));
        assert!(!verify_server(key, 3, &client, &server, &proof));
        let answer = server_proof(key, 3, &client, &server);
        assert_ne!(answer, proof);
        assert!(verify_server(key, 3, &client, &server, &answer));
        // a truncated proof
        assert!(!verify_client(key, 3, &client, &server, &proof[..16]));
        // the key appears in neither
        assert!(!proof.windows(key.len()).any(|w| w == key));
    }
}
