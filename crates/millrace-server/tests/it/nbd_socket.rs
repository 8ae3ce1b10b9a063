//! `export nbd add --socket PATH` (issue #16 item 6): the path comes from an API client, so the
//! server must never replace what is there (a pool's own drive file, a directory, a symbolic
//! link) nor, when the export is removed, delete a file that is not the socket it made.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

use millrace_server::model::CreatePool;
use millrace_server::State;

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_socket_replaces_and_removes_nothing_but_its_own() {
    let d = tempfile::tempdir().unwrap();
    let home = d.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let state = State::open(&home).unwrap();
    let drives: Vec<PathBuf> = (0..2).map(|i| d.path().join(format!("d{i}.img"))).collect();
    state
        .create_pool(CreatePool {
            name: "p".into(),
            level: "raid0".into(),
            strip_bytes: None,
            group: None,
            drives: drives.clone(),
            create_size_bytes: Some(64 * MIB),
            data_offset_bytes: None,
            force: false,
        })
        .unwrap();
    state
        .create_volume("p", "v", 16 * MIB, false, Default::default())
        .unwrap();
    let drive = &drives[0];
    let (ino, bytes) = (
        std::fs::metadata(drive).unwrap().ino(),
        std::fs::read(drive).unwrap(),
    );
    let dir = d.path().join("a-folder");
    std::fs::create_dir(&dir).unwrap();
    let link = d.path().join("a-link");
    std::os::unix::fs::symlink(d.path().join("elsewhere.sock"), &link).unwrap();
    for (path, what) in [
        (drive, "a regular file"),
        (&dir, "a directory"),
        (&link, "a symbolic link"),
    ] {
        let e = state
            .add_nbd_export("p", "v", None, vec![], None, Some(path.clone()))
            .unwrap_err();
        assert!(e.message.contains(what), "{}", e.message);
        assert!(state.nbd.exports().is_empty(), "nothing half-made");
    }
    let m = std::fs::metadata(drive).unwrap();
    assert!(
        m.is_file() && m.ino() == ino,
        "the drive file is still the drive"
    );
    assert!(
        std::fs::read(drive).unwrap() == bytes,
        "and holds what it held"
    );
    assert!(dir.is_dir());
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!d.path().join("elsewhere.sock").exists());

    // A path where nothing is: the export serves there. If someone puts a file in its place,
    // removing the export leaves that file alone.
    let sock = d.path().join("sockets/v.sock");
    state
        .add_nbd_export("p", "v", None, vec![], None, Some(sock.clone()))
        .unwrap();
    assert!(std::fs::symlink_metadata(&sock)
        .unwrap()
        .file_type()
        .is_socket());
    std::fs::remove_file(&sock).unwrap();
    std::fs::write(&sock, b"someone's data").unwrap();
    state.remove_nbd_export("p", "v").unwrap();
    assert_eq!(std::fs::read(&sock).unwrap(), b"someone's data");

    // A socket left by a server that is gone (stale) is taken, and removed with the export.
    std::fs::remove_file(&sock).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    state
        .add_nbd_export("p", "v", None, vec![], None, Some(sock.clone()))
        .unwrap();
    state.remove_nbd_export("p", "v").unwrap();
    assert!(!sock.exists(), "the export's own socket goes with it");
    state.close().unwrap();
}
