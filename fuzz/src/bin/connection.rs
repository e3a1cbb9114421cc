//! Fuzz target: a whole data-plane connection, the handshake then the request handlers
//! ([`ebbflow_runtime::fuzzing::connection`]).
fn main() {
    let rt = ebbflow_runtime::fuzzing::runtime();
    afl::fuzz!(|data: &[u8]| {
        ebbflow_runtime::fuzzing::connection(&rt, data);
    });
}
