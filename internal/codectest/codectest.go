// Package codectest helps test hand-written msgpack encoders against the
// reflective one: Fill sets every field of a record, so that a field added to
// a type but not to its encoder makes the bytes differ.
package codectest

import (
	"reflect"
	"strings"
	"time"
)

// Fill sets every exported field of the struct v points to, recursively, to a
// value that is not empty: strings, numbers, booleans, times, pointers, maps
// and slices of one element. Byte slices hold one msgpack value (the integer
// 1), so that an embedded raw value stays valid. Fields tagged json:"-" are
// left alone.
func Fill(v any) {
	fill(reflect.ValueOf(v).Elem(), "x")
}

func fill(v reflect.Value, name string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(name)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), name)
		v.Set(p)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, name+"-key")
		fill(e, name+"-value")
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes([]byte{0x01})
			return
		}
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), name)
		v.Set(s)
	case reflect.Interface:
		v.Set(reflect.ValueOf(name))
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)))
			return
		}
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() || strings.Split(f.Tag.Get("json"), ",")[0] == "-" {
				continue
			}
			fill(v.Field(i), f.Name)
		}
	}
}
