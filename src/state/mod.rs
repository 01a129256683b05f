//! State machines: the one place that says which status changes are allowed, for actions
//! ([`action`]), jobs ([`job`]) and item claims ([`claim`]). Stores encode these rules as guards
//! in their `UPDATE … WHERE status = …` statements; `docs/state_machine.md` draws them.

pub mod action;
pub mod claim;
pub mod job;

pub use action::{sql, ActionStatus, ActionTransition};
pub use claim::{ClaimStatus, ClaimTransition};
pub use job::{step_gate, JobStatus, JobTransition, ParentView, StepGate};
