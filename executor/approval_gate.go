package executor

import "github.com/capstan-dev/capstan/envelope"

// approvalGate is stage 8. It reports whether the execution goes on.
func (x *execution) approvalGate(v verdict) bool {
	needed := v.stance == RequireApproval || (x.b.meta.Approval != nil && x.b.meta.Approval.Required)
	if !needed && x.req.ApprovalID == "" {
		return true
	}
	x.deny("approval-unavailable", &envelope.CapabilityError{Code: envelope.CodeForbidden, Stage: envelope.StageApproval,
		ExposeToModel: true, Message: "This call needs an approval, and approvals are not available here."}, v.records)
	return false
}

// restoreGrant finds the approval a takeover's execution already consumed.
func (x *execution) restoreGrant() *envelope.CapabilityError { return nil }
