package webhook

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The encoders below write what encoding/json writes for the same values,
// byte for byte (TestAppendReviewIsEncodingJSON and FuzzAppendReview hold
// it), without reflection: a response is written for every fenced write.

// appendReview appends the admission.k8s.io/v1 AdmissionReview that
// carries resp. A response with a field it does not write (none of
// fencer's) is written by encoding/json instead.
func appendReview(out []byte, resp *admissionv1.AdmissionResponse) []byte {
	if !leanEncodable(resp) {
		return append(out, reviewJSON(resp)...)
	}
	out = append(out, `{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","response":{"uid":`...)
	out = appendString(out, string(resp.UID))
	out = append(out, `,"allowed":`...)
	out = strconv.AppendBool(out, resp.Allowed)
	if resp.Result != nil {
		out = append(out, `,"status":`...)
		out = appendStatus(out, resp.Result)
	}
	if len(resp.Patch) > 0 {
		out = append(out, `,"patch":"`...)
		out = base64.StdEncoding.AppendEncode(out, resp.Patch)
		out = append(out, '"')
	}
	if resp.PatchType != nil {
		out = append(out, `,"patchType":`...)
		out = appendString(out, string(*resp.PatchType))
	}
	if len(resp.AuditAnnotations) > 0 {
		out = append(out, `,"auditAnnotations":{`...)
		keys := make([]string, 0, len(resp.AuditAnnotations))
		for k := range resp.AuditAnnotations {
			keys = append(keys, k)
		}
		slices.Sort(keys) // as encoding/json writes maps
		for i, k := range keys {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendString(out, k)
			out = append(out, ':')
			out = appendString(out, resp.AuditAnnotations[k])
		}
		out = append(out, '}')
	}
	if len(resp.Warnings) > 0 {
		out = append(out, `,"warnings":[`...)
		for i, w := range resp.Warnings {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendString(out, w)
		}
		out = append(out, ']')
	}
	return append(out, "}}"...)
}

// leanEncodable says whether appendReview writes every field resp has set.
func leanEncodable(resp *admissionv1.AdmissionResponse) bool {
	s := resp.Result
	if s == nil {
		return true
	}
	if s.TypeMeta != (metav1.TypeMeta{}) || s.ListMeta != (metav1.ListMeta{}) {
		return false
	}
	d := s.Details
	return d == nil || (d.Name == "" && d.Group == "" && d.Kind == "" && d.UID == "" && d.RetryAfterSeconds == 0)
}

// appendStatus appends s; leanEncodable has checked it sets no other field.
func appendStatus(out []byte, s *metav1.Status) []byte {
	out = append(out, `{"metadata":{}`...)
	for _, f := range [...]struct{ name, v string }{{"status", s.Status}, {"message", s.Message}, {"reason", string(s.Reason)}} {
		if f.v != "" {
			out = append(out, `,"`...)
			out = append(out, f.name...)
			out = append(out, `":`...)
			out = appendString(out, f.v)
		}
	}
	if s.Details != nil {
		out = append(out, `,"details":{`...)
		if len(s.Details.Causes) > 0 {
			out = append(out, `"causes":[`...)
			for i, c := range s.Details.Causes {
				if i > 0 {
					out = append(out, ',')
				}
				out = appendCause(out, c)
			}
			out = append(out, ']')
		}
		out = append(out, '}')
	}
	if s.Code != 0 {
		out = append(out, `,"code":`...)
		out = strconv.AppendInt(out, int64(s.Code), 10)
	}
	return append(out, '}')
}

func appendCause(out []byte, c metav1.StatusCause) []byte {
	out = append(out, '{')
	first := true
	for _, f := range [...]struct{ name, v string }{{"reason", string(c.Type)}, {"message", c.Message}, {"field", c.Field}} {
		if f.v == "" {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, '"')
		out = append(out, f.name...)
		out = append(out, `":`...)
		out = appendString(out, f.v)
	}
	return append(out, '}')
}

// appendPatch appends ops as a JSON Patch. Values other than a string or a
// map of strings (fencer writes no others) are written by encoding/json.
func appendPatch(out []byte, ops []jsonpatch.JsonPatchOperation) ([]byte, error) {
	out = append(out, '[')
	for i, op := range ops {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"op":`...)
		out = appendString(out, op.Operation)
		out = append(out, `,"path":`...)
		out = appendString(out, op.Path)
		var err error
		if out, err = appendPatchValue(out, op); err != nil {
			return nil, err
		}
		out = append(out, '}')
	}
	return append(out, ']'), nil
}

// appendPatchValue writes op's value as jsonpatch's own MarshalJSON does:
// an unset value is null for "add" and "replace" and omitted otherwise.
func appendPatchValue(out []byte, op jsonpatch.JsonPatchOperation) ([]byte, error) {
	if op.Value == nil && op.Operation != "add" && op.Operation != "replace" {
		return out, nil
	}
	out = append(out, `,"value":`...)
	switch v := op.Value.(type) {
	case nil:
		return append(out, "null"...), nil
	case string:
		return appendString(out, v), nil
	case map[string]string:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		out = append(out, '{')
		for i, k := range keys {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendString(out, k)
			out = append(out, ':')
			out = appendString(out, v[k])
		}
		return append(out, '}'), nil
	default:
		raw, err := json.Marshal(v)
		return append(out, raw...), err
	}
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, escaped as encoding/json
// escapes it: quotes, backslashes, control characters, <, > and & (HTML
// safe), U+2028 and U+2029; invalid UTF-8 becomes U+FFFD.
func appendString(out []byte, s string) []byte {
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			out = append(out, s[start:i]...)
			switch b {
			case '"', '\\':
				out = append(out, '\\', b)
			case '\b':
				out = append(out, `\b`...)
			case '\f':
				out = append(out, `\f`...)
			case '\n':
				out = append(out, `\n`...)
			case '\r':
				out = append(out, `\r`...)
			case '\t':
				out = append(out, `\t`...)
			default:
				out = append(out, `\u00`...)
				out = append(out, hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, s[start:i]...)
			out = append(out, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			out = append(out, s[start:i]...)
			out = append(out, `\u202`...)
			out = append(out, hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}
