//! Admin HTTP API types shared by the runtime coordinator and the operator.
