//! Whether a lock's holder still reaches the operator: `elect` and the Job guard ask the active replica how long
//! their grant stays valid (`POST /v1/validity`) and start or keep their work only on its answers, so a holder
//! that cannot reach the reports port (a NetworkPolicy without the egress rule, a cut-off pod) runs nothing while
//! status shows it holding. The replica records each answered ask (`asks`); the rule (`rule`, pure) tells a
//! holder that asks from one that never did or stopped, and what the lock shows for it (the condition
//! `HolderReachesOperator`).

pub mod asks;
pub mod rule;
