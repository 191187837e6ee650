package proc

// SetReadMaps puts read in ReadMaps' place for Maps, until restore.
func SetReadMaps(read func(pid int) ([]Mapping, error)) (restore func()) {
	old := readMaps
	readMaps = read
	return func() { readMaps = old }
}
