//! Fuzz target: the frame and message decoders ([`ebbflow_runtime::fuzzing::frames`]).
fn main() {
    afl::fuzz!(|data: &[u8]| ebbflow_runtime::fuzzing::frames(data));
}
