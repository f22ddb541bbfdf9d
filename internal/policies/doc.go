// Package policies keeps a deployment's Cedar policies (DESIGN §18): policy
// sets written in the Cedar language (github.com/cedar-policy/cedar-go),
// stored as data in the policies bucket, which admins write and every worker
// watches, versioned, in force on every worker within seconds of an apply,
// with no restart.
//
// A call is a Cedar request: its actor is the principal (an entity of type
// User, Agent, Service or Anonymous, in the entity Principal::"<name>" of
// the NATS principal it came from, its attributes as tags), the action is the
// capability's id (every one in the action "call"), the resource the
// capability (Capability::"<id>", with its side effect, risk, idempotence and
// tags as attributes), and the context holds the surface and the validated
// input, field by field, typed as the capability's input schema says. The
// catalog's input schemas make the Cedar schema (Schema) a policy set is
// validated against before it is applied: one that does not parse, or does
// not validate, is refused whole.
//
// Decisions follow Cedar: a forbid wins, and nothing is permitted without a
// permit. A policy that cannot be evaluated (an error in it, an input field
// it reads that the call lacks) fails the call closed, named. No set in
// force costs a worker one nil pointer's load per call.
package policies
