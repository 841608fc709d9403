package config

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// ErrUnknownHost is wrapped when this machine is not one of the file's hosts.
var ErrUnknownHost = errors.New("this host is not in the cluster file")

// Identify picks which of the file's hosts this machine is: the --host flag
// when given, else the hostname (full, then up to the first dot), else the
// host whose address is one of localAddrs.
func (c *Config) Identify(flagHost, hostname string, localAddrs []net.IP) (string, error) {
	if flagHost != "" {
		if _, ok := c.Hosts[flagHost]; ok {
			return flagHost, nil
		}
		return "", fmt.Errorf("%w: --host %q is not one of %s's hosts (%s)", ErrUnknownHost, flagHost, c.Path, strings.Join(c.HostNames(), ", "))
	}
	if hostname != "" {
		if _, ok := c.Hosts[hostname]; ok {
			return hostname, nil
		}
		if short, _, _ := strings.Cut(hostname, "."); short != hostname {
			if _, ok := c.Hosts[short]; ok {
				return short, nil
			}
		}
	}
	var match []string
	for _, name := range c.HostNames() {
		ip := net.ParseIP(c.Hosts[name].Address)
		for _, l := range localAddrs {
			if ip != nil && ip.Equal(l) {
				match = append(match, name)
				break
			}
		}
	}
	switch len(match) {
	case 1:
		return match[0], nil
	case 0:
		return "", fmt.Errorf("%w: --host not given, hostname %q names no [hosts.*] entry of %s, and no host's address is local (hosts: %s); pass --host NAME",
			ErrUnknownHost, hostname, c.Path, strings.Join(c.HostNames(), ", "))
	default:
		return "", fmt.Errorf("%w: several hosts have a local address (%s); pass --host NAME", ErrUnknownHost, strings.Join(match, ", "))
	}
}

// LocalAddrs lists this machine's interface addresses.
func LocalAddrs() []net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP)
		}
	}
	return out
}
