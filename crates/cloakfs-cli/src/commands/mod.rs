//! One module per subcommand.

pub mod info;
pub mod init;
pub mod mount;
pub mod unmount;
