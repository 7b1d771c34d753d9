package coalesce

import "syscall"

// lowWaterSupported: Linux honours SO_RCVLOWAT in poll and epoll for TCP.
const lowWaterSupported = true

func setLowWater(fd uintptr, bytes int) error {
	return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, bytes)
}
