package driver

import (
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"millrace.dev/csi/internal/millrace"
)

// apiStatus turns a Millrace API error into the gRPC code the CSI spec asks for: a server
// that cannot be reached is Unavailable (with the server named, so the orchestrator retries
// and an operator knows which), a missing thing NotFound, a conflict with the current state
// FailedPrecondition, a refused argument InvalidArgument, a wrong token Unauthenticated.
// what says what the driver was doing ("creating volume X").
func apiStatus(err error, what string) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !isAPI(err) {
		return err
	}
	code := codes.Internal
	var a *millrace.APIError
	switch {
	case millrace.IsDown(err):
		code = codes.Unavailable
	case errors.As(err, &a):
		switch a.Status {
		case http.StatusNotFound:
			code = codes.NotFound
		case http.StatusConflict:
			code = codes.FailedPrecondition
		case http.StatusBadRequest:
			code = codes.InvalidArgument
		case http.StatusUnauthorized, http.StatusForbidden:
			code = codes.Unauthenticated
		}
	}
	return status.Errorf(code, "%s: %v", what, err)
}

func isAPI(err error) bool {
	var a *millrace.APIError
	var d *millrace.DownError
	return errors.As(err, &a) || errors.As(err, &d)
}
