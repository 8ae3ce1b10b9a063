//! The API's OpenAPI 3.0 description, served at /api/v1/openapi.json. Written out here rather
//! than derived, because the handlers return shapes composed from several crates' types; the
//! API tests check that every documented call answers as described.

use serde_json::{json, Value};

fn err() -> Value {
    json!({"description": "Refused; the body says why", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

fn ok(desc: &str, schema: Value) -> Value {
    json!({"description": desc, "content": {"application/json": {"schema": schema}}})
}

fn r(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn body(schema: Value) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema}}})
}

fn param(name: &str) -> Value {
    // Job ids are numbers; pool and volume names are strings.
    let ty = if name == "id" { "integer" } else { "string" };
    json!({"name": name, "in": "path", "required": true, "schema": {"type": ty}})
}

fn op(summary: &str, params: &[&str], req: Option<Value>, code: &str, resp: Value) -> Value {
    let mut o = json!({
        "summary": summary,
        "parameters": params.iter().map(|p| param(p)).collect::<Vec<_>>(),
        "responses": {code: resp, "400": err(), "401": err(), "404": err(), "409": err()},
    });
    if let Some(b) = req {
        o["requestBody"] = body(b);
    }
    o
}

fn obj(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required})
}

pub fn document() -> Value {
    let int = json!({"type": "integer", "minimum": 0});
    let string = json!({"type": "string"});
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let job = obj(json!({"job": int}), &["job"]);
    let query = |name: &str, desc: &str| json!({"name": name, "in": "query", "required": true, "description": desc, "schema": {"type": "integer", "minimum": 0}});
    let errors = json!({"400": err(), "401": err(), "404": err(), "409": err()});
    let mut read_resp = errors.clone();
    read_resp["200"] = json!({"description": "The bytes", "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}});
    let mut write_resp = errors.clone();
    write_resp["200"] = ok(
        "Written and flushed",
        obj(json!({"written": int}), &["written"]),
    );
    let data = json!({
        "get": {
            "summary": "Read raw bytes of a pool (at most 64 MiB a call)",
            "parameters": [param("pool"), query("offset", "Byte offset in the pool"), query("length", "How many bytes")],
            "responses": read_resp,
        },
        "put": {
            "summary": "Write raw bytes to a pool (at most 64 MiB a call); durable when answered",
            "parameters": [param("pool"), query("offset", "Byte offset in the pool")],
            "requestBody": {"required": true, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
            "responses": write_resp,
        },
    });
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Millrace API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Pools, members, volumes, exports, rebuilds and scrubs of a Millrace data server. Listening beyond loopback, every call needs 'Authorization: Bearer TOKEN'."
        },
        "paths": {
            "/api/v1/status": {"get": op("The server at a glance", &[], None, "200", ok("Counts", r("Status")))},
            "/api/v1/pools": {
                "get": op("Every pool served", &[], None, "200", ok("Pools", obj(json!({"pools": {"type": "array", "items": r("Pool")}}), &["pools"]))),
                "post": op("Create a pool", &[], Some(r("CreatePool")), "201", ok("The new pool", r("Pool"))),
            },
            "/api/v1/pools/{pool}": {
                "get": op("One pool: geometry, state, members, volumes, counters", &["pool"], None, "200", ok("The pool", r("Pool"))),
                "delete": op("Destroy a pool (refused while it exports volumes)", &["pool"], None, "200", ok("Done", obj(json!({"destroyed": string}), &["destroyed"]))),
            },
            "/api/v1/pools/import": {"post": op("Assemble and serve the pools found on these drives", &[], Some(obj(json!({"drives": strings, "force": {"type": "boolean"}}), &["drives"])), "200", ok("The pools found", obj(json!({"pools": {"type": "array", "items": r("Pool")}, "notes": strings}), &["pools", "notes"])))},
            "/api/v1/pools/{pool}/data": data,
            "/api/v1/pools/{pool}/fail": {"post": op("Take a member out of service", &["pool"], Some(r("PathRequest")), "200", ok("Done", r("Message")))},
            "/api/v1/pools/{pool}/spares": {"post": op("Add a hot spare", &["pool"], Some(r("PathRequest")), "200", ok("Done", r("Message")))},
            "/api/v1/pools/{pool}/replace": {"post": op("Replace a member and rebuild onto the new drive", &["pool"], Some(obj(json!({"old": string, "new": string, "force": {"type": "boolean"}, "rate_bytes_per_sec": {"type": "integer", "minimum": 0, "nullable": true}}), &["old", "new"])), "200", ok("Started", obj(json!({"message": string, "job": {"type": "integer", "nullable": true}}), &["message"])))},
            "/api/v1/pools/{pool}/scrub": {"post": op("Start a scrub", &["pool"], Some(obj(json!({"repair": {"type": "boolean"}}), &[])), "202", ok("Started", job.clone()))},
            "/api/v1/pools/{pool}/rebuild": {"post": op("Start or follow the rebuild of members waiting for one", &["pool"], Some(obj(json!({"rate_bytes_per_sec": {"type": "integer", "minimum": 0, "nullable": true}}), &[])), "200", ok("The job, or null when nothing waits", obj(json!({"job": {"type": "integer", "nullable": true}}), &["job"])))},
            "/api/v1/pools/{pool}/volumes": {
                "get": op("A pool's volumes", &["pool"], None, "200", ok("Volumes", obj(json!({"volumes": {"type": "array", "items": r("Volume")}}), &["volumes"]))),
                "post": op("Create a volume (size rounded up to the full stripe); `props` are tags of the client's own (keys of letters, digits, '.', '_', '-', '/'; not export.* or share*), written with it", &["pool"], Some(obj(json!({"name": string, "size_bytes": int, "force": {"type": "boolean"}, "props": {"type": "object", "additionalProperties": {"type": "string"}}}), &["name", "size_bytes"])), "201", ok("The volume", r("Volume"))),
            },
            "/api/v1/pools/{pool}/volumes/{vol}": {
                "get": op("One volume", &["pool", "vol"], None, "200", ok("The volume", r("Volume"))),
                "patch": op("Grow a volume in place", &["pool", "vol"], Some(obj(json!({"size_bytes": int}), &["size_bytes"])), "200", ok("The volume", r("Volume"))),
                "delete": op("Delete a volume (refused while exported)", &["pool", "vol"], None, "200", ok("Done", obj(json!({"deleted": string}), &["deleted"]))),
            },
            "/api/v1/bench": {"post": op("Start a bench run: a simulated pool, or the read workloads of a served pool; its job's result holds `results` (as `millrace bench --json`) and `table`", &[], Some(obj(json!({
                "pool": {"type": "string", "nullable": true}, "sim": {"type": "string", "nullable": true},
                "level": {"type": "string", "nullable": true}, "strip_bytes": {"type": "integer", "minimum": 0, "nullable": true},
                "group": {"type": "integer", "minimum": 0, "nullable": true}, "suite": {"type": "string", "enum": ["seq", "rand", "mixed", "all"], "nullable": true},
                "jobs": {"type": "array", "items": {"type": "integer", "minimum": 0}, "nullable": true},
                "iodepth": {"type": "array", "items": {"type": "integer", "minimum": 0}, "nullable": true},
                "bs": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "degraded": {"type": "array", "items": {"type": "integer", "minimum": 0}, "nullable": true},
                "seconds": {"type": "number", "nullable": true},
            }), &[])), "202", ok("Started", job.clone()))},
            "/api/v1/jobs": {"get": op("Rebuilds, scrubs and bench runs, running and finished", &[], None, "200", ok("Jobs", obj(json!({"jobs": {"type": "array", "items": r("Job")}}), &["jobs"])))},
            "/api/v1/jobs/{id}": {"get": op("One job", &["id"], None, "200", ok("The job", r("Job")))},
            "/api/v1/exports": {"get": op("Every export and who is connected", &[], None, "200", ok("Exports", r("Exports")))},
            "/api/v1/exports/nvme": {"post": op("Export a volume over NVMe/TCP (closed unless hosts are named or allow_any_host)", &[], Some(obj(json!({"pool": string, "volume": string, "nqn": {"type": "string", "nullable": true}, "hosts": strings, "allow_any_host": {"type": "boolean"}}), &["pool", "volume"])), "201", ok("The export", r("NvmeExport")))},
            "/api/v1/exports/nvme/{pool}/{vol}": {"delete": op("Stop exporting a volume over NVMe/TCP", &["pool", "vol"], None, "200", ok("Done", obj(json!({"removed": string}), &["removed"])))},
            "/api/v1/exports/nvme/{pool}/{vol}/hosts/{host}": {
                "put": op("Let one more host (its NQN, percent-encoded) connect to a volume's NVMe/TCP export; a host already there changes nothing", &["pool", "vol", "host"], None, "200", ok("The export", r("NvmeExport"))),
                "delete": op("Take one host off a volume's NVMe/TCP export and disconnect it; the export stays (a host not on it changes nothing)", &["pool", "vol", "host"], None, "200", ok("The export", r("NvmeExport"))),
            },
            "/api/v1/exports/nbd": {"post": op("Export a volume over NBD (Unix socket; TCP only for listed clients)", &[], Some(obj(json!({"pool": string, "volume": string, "name": {"type": "string", "nullable": true}, "clients": strings}), &["pool", "volume"])), "201", ok("The export", obj(json!({"name": string, "clients": strings}), &["name", "clients"])))},
            "/api/v1/exports/nbd/{pool}/{vol}": {"delete": op("Stop exporting a volume over NBD", &["pool", "vol"], None, "200", ok("Done", obj(json!({"removed": string}), &["removed"])))},
            "/api/v1/shares": {
                "get": op("Every NFS share", &[], None, "200", ok("Shares", obj(json!({"shares": {"type": "array", "items": r("Share")}}), &["shares"]))),
                "post": op("Create a share: a volume, XFS aligned to the pool's stripes, mounted and exported by the kernel NFS server (v3, v4.2) to the listed clients", &[], Some(obj(json!({"pool": string, "volume": string, "size_bytes": int, "clients": strings, "sync": {"type": "boolean", "default": true}, "root_squash": {"type": "boolean", "default": true}}), &["pool", "volume", "size_bytes", "clients"])), "201", ok("The share", r("Share"))),
            },
            "/api/v1/shares/{pool}/{vol}": {"delete": op("Delete a share: unexport, unmount, detach, and delete its volume", &["pool", "vol"], None, "200", ok("Done", obj(json!({"deleted": string}), &["deleted"])))},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": obj(json!({"error": string}), &["error"]),
                "Message": obj(json!({"message": string}), &["message"]),
                "PathRequest": obj(json!({"path": string, "force": {"type": "boolean"}}), &["path"]),
                "Status": obj(json!({"version": string, "uptime_s": int, "pools": int, "volumes": int, "exports": int, "unavailable_pools": {"type": "object", "additionalProperties": {"type": "string"}}, "rdma": r("Rdma"),
                    "nvme_listeners": {"type": "array", "description": "Where NVMe hosts connect (an address of 0.0.0.0 or :: means every address of the server)", "items": obj(json!({"transport": {"type": "string", "enum": ["tcp", "rdma"]}, "address": string, "port": int}), &["transport", "address", "port"])},
                    "nvme_hosts": obj(json!({"tcp": int, "rdma": int}), &["tcp", "rdma"])}), &["version", "uptime_s", "pools", "volumes", "exports", "nvme_listeners", "nvme_hosts"]),
                "NvmeExport": obj(json!({"nqn": string, "hosts": strings, "allow_any_host": {"type": "boolean"}}), &["nqn", "hosts", "allow_any_host"]),
                "CreatePool": obj(json!({"name": string, "level": {"type": "string", "enum": ["raid0", "raid1", "raid10", "raid5", "raid6", "raid50", "raid60"]}, "strip_bytes": {"type": "integer", "nullable": true}, "group": {"type": "integer", "nullable": true}, "drives": strings, "create_size_bytes": {"type": "integer", "nullable": true}, "force": {"type": "boolean"}}), &["name", "level", "drives"]),
                "Member": obj(json!({"index": int, "path": {"type": "string", "nullable": true}, "uuid": string, "state": {"type": "string", "enum": ["online", "faulty", "spare", "rebuilding", "missing"]}, "data_offset_bytes": int, "group": int}), &["index", "state", "group"]),
                "Volume": obj(json!({"name": string, "uuid": string, "offset_bytes": int, "size_bytes": int, "created_unix": int, "props": {"type": "object", "additionalProperties": {"type": "string"}}}), &["name", "uuid", "offset_bytes", "size_bytes"]),
                "Pool": obj(json!({
                    "name": string, "uuid": string, "level": string, "strip_bytes": int, "group_size": int, "groups": int,
                    "data_drives_per_group": int, "size_bytes": int, "full_stripe_bytes": int,
                    "state": {"type": "string", "description": "online, degraded, rebuilding NN%, or offline"},
                    "clean": {"type": "boolean"}, "events": int, "data_offset_bytes": int, "member_data_bytes": int,
                    "members": {"type": "array", "items": r("Member")}, "spares": strings,
                    "free_bytes": {"type": "integer", "minimum": 0, "description": "Bytes no volume holds"},
                    "largest_free_bytes": {"type": "integer", "minimum": 0, "description": "The largest volume that could be created now"},
                    "rebuild": {"type": "object", "nullable": true, "properties": {"rows_done": int, "rows_total": int, "percent": {"type": "number"}}},
                    "volumes": {"type": "array", "items": r("Volume")},
                    "stats": obj(json!({"read_bytes": int, "write_bytes": int, "read_ops": int, "write_ops": int}), &["read_bytes", "write_bytes", "read_ops", "write_ops"]),
                    "member_stats": {"type": "array", "items": obj(json!({"index": int, "read_bytes": int, "write_bytes": int, "read_ops": int, "write_ops": int, "errors": int}), &["index", "read_bytes", "write_bytes", "read_ops", "write_ops", "errors"])},
                }), &["name", "level", "state", "size_bytes", "members", "volumes", "stats", "member_stats", "free_bytes", "largest_free_bytes"]),
                "Job": obj(json!({"id": int, "kind": {"type": "string", "enum": ["rebuild", "scrub", "bench"]}, "pool": string, "state": {"type": "string", "enum": ["running", "done", "failed"]}, "done": int, "total": int, "percent": {"type": "number"}, "message": string, "result": {"type": "object", "nullable": true}}), &["id", "kind", "pool", "state", "percent"]),
                "Rdma": obj(json!({"devices": {"type": "array", "items": obj(json!({"name": string, "node_guid": string, "ports": {"type": "array", "items": obj(json!({"port": int, "state": string, "link_layer": string, "rate": string, "netdev": {"type": "string", "nullable": true}}), &["port", "state", "link_layer", "rate", "netdev"])}}), &["name", "node_guid", "ports"])}, "nfs_rdma_port": {"type": "integer", "nullable": true}}), &["devices", "nfs_rdma_port"]),
                "Share": obj(json!({"pool": string, "volume": string, "size_bytes": int, "clients": strings, "sync": {"type": "boolean"}, "root_squash": {"type": "boolean"}, "mountpoint": string, "nbd_socket": string, "nbd_device": {"type": "string", "nullable": true}, "mounted": {"type": "boolean"}, "exported": {"type": "boolean"}, "nfs_path": string, "nfs_rdma_port": {"type": "integer", "nullable": true}}), &["pool", "volume", "size_bytes", "clients", "sync", "root_squash", "mountpoint", "mounted", "exported", "nfs_path"]),
                "Exports": obj(json!({
                    "nvme": {"type": "array", "items": obj(json!({"pool": string, "volume": string, "nqn": string, "hosts": strings, "allow_any_host": {"type": "boolean"}, "serving": {"type": "boolean"}, "connections": {"type": "array", "items": obj(json!({"host": string, "peer": string, "io_queues": int, "transport": {"type": "string", "enum": ["tcp", "rdma"]}}), &["host", "peer", "transport"])}}), &["pool", "volume", "nqn", "connections"])},
                    "nbd": {"type": "array", "items": obj(json!({"pool": string, "volume": string, "name": string, "clients": strings, "serving": {"type": "boolean"}, "connections": int}), &["pool", "volume", "name", "connections"])},
                }), &["nvme", "nbd"]),
            }
        },
        "security": [{"bearer": []}],
    })
}
