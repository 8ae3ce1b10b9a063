// Package millrace is a client of one Millrace server's HTTP API (/api/v1, described by the
// server at /api/v1/openapi.json): the pools with their free space and volumes, volumes,
// NVMe/TCP exports and their hosts, and where the NVMe/TCP listeners serve.
package millrace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to one server. It is safe for concurrent use.
type Client struct {
	// Name is how the driver names the server in volume ids and errors.
	Name  string
	URL   *url.URL
	token string
	http  *http.Client
}

// New makes a client for the server at rawURL (http or https); token may be empty.
func New(name, rawURL, token string, timeout time.Duration) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not a server URL: write it like http://10.0.0.5:8740", rawURL)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	return &Client{Name: name, URL: u, token: token, http: &http.Client{Timeout: timeout}}, nil
}

// APIError is a refusal from the server: its HTTP status and its sentence.
type APIError struct {
	Server  string
	Status  int
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("millrace server %s answered %d: %s", e.Server, e.Status, e.Message)
}

// DownError says the server could not be reached (refused, timed out, no route).
type DownError struct {
	Server string
	URL    string
	Err    error
}

func (e *DownError) Error() string {
	return fmt.Sprintf("millrace server %s (%s) does not answer: %v", e.Server, e.URL, e.Err)
}

func (e *DownError) Unwrap() error { return e.Err }

// IsStatus tells whether err is a refusal with this HTTP status.
func IsStatus(err error, status int) bool {
	var a *APIError
	return errors.As(err, &a) && a.Status == status
}

// IsDown tells whether err says the server could not be reached.
func IsDown(err error) bool {
	var d *DownError
	return errors.As(err, &d)
}

// The most of a response body the client reads: the API's largest answers (a pool list with
// every volume) are far smaller.
const maxBody = 16 << 20

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL.String()+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return &DownError{Server: c.Name, URL: c.URL.String(), Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return &DownError{Server: c.Name, URL: c.URL.String(), Err: err}
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return &APIError{Server: c.Name, Status: resp.StatusCode, Message: e.Error}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("millrace server %s sent an answer to %s %s that is not what the API describes: %v", c.Name, method, path, err)
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }

// Status is the server at a glance, with where NVMe hosts connect.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.do(ctx, http.MethodGet, "/api/v1/status", nil, &s)
}

// Pools lists every pool served, each with its volumes and free space.
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var r struct {
		Pools []Pool `json:"pools"`
	}
	return r.Pools, c.do(ctx, http.MethodGet, "/api/v1/pools", nil, &r)
}

// Pool gets one pool.
func (c *Client) Pool(ctx context.Context, name string) (*Pool, error) {
	var p Pool
	return &p, c.do(ctx, http.MethodGet, "/api/v1/pools/"+esc(name), nil, &p)
}

// Volume gets one volume.
func (c *Client) Volume(ctx context.Context, pool, name string) (*Volume, error) {
	var v Volume
	return &v, c.do(ctx, http.MethodGet, "/api/v1/pools/"+esc(pool)+"/volumes/"+esc(name), nil, &v)
}

// CreateVolume makes a volume of at least size bytes carrying props.
func (c *Client) CreateVolume(ctx context.Context, pool, name string, size int64, props map[string]string) (*Volume, error) {
	var v Volume
	body := map[string]any{"name": name, "size_bytes": size, "props": props}
	return &v, c.do(ctx, http.MethodPost, "/api/v1/pools/"+esc(pool)+"/volumes", body, &v)
}

// GrowVolume grows a volume in place to at least size bytes.
func (c *Client) GrowVolume(ctx context.Context, pool, name string, size int64) (*Volume, error) {
	var v Volume
	body := map[string]any{"size_bytes": size}
	return &v, c.do(ctx, http.MethodPatch, "/api/v1/pools/"+esc(pool)+"/volumes/"+esc(name), body, &v)
}

// DeleteVolume deletes a volume (the server refuses while it is exported).
func (c *Client) DeleteVolume(ctx context.Context, pool, name string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/pools/"+esc(pool)+"/volumes/"+esc(name), nil, nil)
}

// DHChap is a host's DH-HMAC-CHAP secrets: the host's own, and the controller's for
// bidirectional authentication (empty: unidirectional).
type DHChap struct {
	Secret, CtrlSecret string
}

// body is the secrets as the API takes them; they travel in request bodies only, never in a
// path or a query, so no proxy or access log records them.
func (k DHChap) body(into map[string]any) {
	into["dhchap_secret"] = k.Secret
	if k.CtrlSecret != "" {
		into["dhchap_ctrl_secret"] = k.CtrlSecret
	}
}

// ExportNVMe exports a volume over NVMe/TCP as subsystem nqn to these hosts only; with keys,
// the hosts must authenticate with them from the first connection.
func (c *Client) ExportNVMe(ctx context.Context, pool, name, nqn string, hosts []string, keys *DHChap) (*NVMeExport, error) {
	var e NVMeExport
	body := map[string]any{"pool": pool, "volume": name, "nqn": nqn, "hosts": hosts}
	if keys != nil {
		keys.body(body)
	}
	return &e, c.do(ctx, http.MethodPost, "/api/v1/exports/nvme", body, &e)
}

// SetNVMeHostKeys sets or rotates the secrets a host authenticates with on a volume's export.
func (c *Client) SetNVMeHostKeys(ctx context.Context, pool, name, host string, keys DHChap) error {
	body := map[string]any{}
	keys.body(body)
	return c.do(ctx, http.MethodPut, c.hostPath(pool, name, host)+"/dhchap", body, nil)
}

// UnexportNVMe removes a volume's NVMe/TCP export.
func (c *Client) UnexportNVMe(ctx context.Context, pool, name string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/exports/nvme/"+esc(pool)+"/"+esc(name), nil, nil)
}

// AddNVMeHost lets one more host connect to a volume's export (a host already there is fine).
func (c *Client) AddNVMeHost(ctx context.Context, pool, name, host string) (*NVMeExport, error) {
	var e NVMeExport
	return &e, c.do(ctx, http.MethodPut, c.hostPath(pool, name, host), nil, &e)
}

// RemoveNVMeHost takes one host off a volume's export and disconnects it.
func (c *Client) RemoveNVMeHost(ctx context.Context, pool, name, host string) (*NVMeExport, error) {
	var e NVMeExport
	return &e, c.do(ctx, http.MethodDelete, c.hostPath(pool, name, host), nil, &e)
}

func (c *Client) hostPath(pool, name, host string) string {
	return "/api/v1/exports/nvme/" + esc(pool) + "/" + esc(name) + "/hosts/" + esc(host)
}
