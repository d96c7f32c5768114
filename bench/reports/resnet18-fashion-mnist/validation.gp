# written by mixprec; re-plot with: cd 'bench/reports/resnet18-fashion-mnist' && gnuplot 'validation.gp'
set terminal pngcairo size 1000,620 noenhanced
set output 'validation.png'
set title 'test accuracy (%)'
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
set grid
set datafile missing '?'
set key top right
plot 'validation.dat' index 0 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'fp32', \
     'validation.dat' index 1 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'bf16'
