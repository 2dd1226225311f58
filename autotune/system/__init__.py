"""The operating system and the devices, as autotune's processes see them: device
detection (`devices`) and process control (`process`). Imports only `core`."""
