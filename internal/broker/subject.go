package broker

import "strings"

// SubjectMatches reports whether filter covers subject: whether a
// subscription, consumer filter or permission on filter takes in everything
// published to subject. It is NATS's own rule, token by token on ".": "*"
// in filter stands for any one token, a ">" for one or more; a subject that
// holds wildcards itself is covered only where filter has a wildcard at least
// as wide ("a.*" is covered by "a.*" and "a.>", not by "a.b"). An empty token
// on either side matches nothing but a ">" already reached.
//
// It gives the answers the server's matcher gives, on every input (a test
// compares the two), so that capstan's libraries need not link the server to
// read a consumer's filters or a principal's permissions.
func SubjectMatches(subject, filter string) bool {
	more := true // subject has a token left to match
	for {
		if !more {
			return false // filter is longer
		}
		f, fRest, fMore := strings.Cut(filter, ".")
		switch f {
		case "":
			return false
		case ">":
			return true
		}
		s, sRest, sMore := strings.Cut(subject, ".")
		switch {
		case s == "" || s == ">":
			return false // an empty token, or a subject wider than a one-token filter
		case s == "*":
			if f != "*" {
				return false
			}
		case f != "*" && f != s:
			return false
		}
		if !fMore {
			return !sMore // both end here, or subject is longer
		}
		filter, subject, more = fRest, sRest, sMore
	}
}
