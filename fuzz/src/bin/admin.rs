//! Fuzz target: the elastic coordinator's admin API ([`ebbflow_runtime::fuzzing::admin`]).
fn main() {
    let rt = ebbflow_runtime::fuzzing::runtime();
    afl::fuzz!(|data: &[u8]| {
        ebbflow_runtime::fuzzing::admin(&rt, data);
    });
}
