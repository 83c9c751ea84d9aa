//! Holders' reports that their work has stopped under a given-up grant: the endpoint that takes them
//! (`endpoint`) and the rule that decides whether one is true and the holder's own (`rule`, pure). A report taken
//! is kept in `cache::stopped_pods`, where the hand-over reads it. What a report may cost the API server before
//! it is known to come from a pod is bounded: the token's text is checked first (`token_shape`), and reviews are
//! spent within a budget (`budget`); both pure. Beside them, holders ask how long their grant stays valid
//! (`validity`), answered from memory at no API call.

pub mod budget;
pub mod endpoint;
pub mod rule;
pub mod token_shape;
pub mod validity;
