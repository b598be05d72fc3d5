//! Processes and their sockets: which processes are watched (names, cgroups, units), their fds, sockets from sock_diag, writers parked in a send, and the pacing of the reads whose cost grows with the node.

pub mod blocking;
pub mod cgroup;
pub mod fd_owners;
pub mod pace;
pub mod parked;
pub mod procs;
pub mod seed;
pub mod sockdiag;
