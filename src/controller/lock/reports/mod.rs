//! Holders' reports that their work has stopped under a given-up grant: the endpoint that takes them
//! (`endpoint`) and the rule that decides whether one is true and the holder's own (`rule`, pure). A report taken
//! is kept in `cache::stopped_pods`, where the hand-over reads it.

pub mod endpoint;
pub mod rule;
